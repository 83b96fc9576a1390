"""JobConfig: presets, overrides parsed to field types, and one-line errors for bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from hpcpipe.config import JobConfig, grad_accum_steps, load_config
from hpcpipe.errors import ConfigError
from hpcpipe.presets import preset_names


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_validates_and_round_trips(name: str, tmp_path: Path) -> None:
    cfg = load_config(name)
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml())
    again = load_config(saved)
    assert again == cfg
    assert again.config_hash() == cfg.config_hash()


def test_overrides_are_parsed_to_the_field_type() -> None:
    cfg = load_config(
        "tiny",
        [
            "train.steps=7",
            "train.lr=1e-3",
            "train.compile=true",
            "run.name=123",
            "model.vocab_size=null",
            "data.sources=[a.txt, b/]",
            "model.variant=llama",
        ],
    )
    assert cfg.train.steps == 7 and isinstance(cfg.train.steps, int)
    assert cfg.train.lr == pytest.approx(1e-3)
    assert cfg.train.compile is True
    assert cfg.run.name == "123"  # a str field keeps the text as written
    assert cfg.model.vocab_size is None
    assert cfg.data.sources == ["a.txt", "b/"]
    assert cfg.model.variant == "llama"


def test_null_clears_an_optional_text_key_and_stays_text_where_text_is_required() -> None:
    # benchmarks/hpo_overhead.py sets hpo.storage=null (the default SQLite file); it read 'null'.
    cfg = load_config("tiny-hpo", ["hpo.storage=null", "checkpoint.dir=~", "run.name=null"])
    assert cfg.hpo.storage is None and cfg.checkpoint.dir is None
    assert cfg.run.name == "null"


def test_config_is_frozen() -> None:
    cfg = load_config("tiny")
    with pytest.raises(Exception):  # noqa: B017  (pydantic's frozen-instance error)
        cfg.train.steps = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "key",
    [
        "run.out_dir",
        "data.root",
        "data.prepared_dir",
        "data.cache_dir",
        "model.gguf_file",
        "checkpoint.dir",
        "checkpoint.durable_dir",
        "observe.prometheus.targets_dir",
        "hpo.dir",
        "launch.slurm.hpcpipe",
        "launch.slurm.container",
        "launch.k8s.image",
        "launch.k8s.hpcpipe",
        "launch.k8s.data_mount",
        "launch.k8s.checkpoint_mount",
        "launch.k8s.runs_mount",
        "launch.k8s.cache_host_path",
    ],
)
def test_an_empty_path_or_command_is_refused_naming_the_key(key: str) -> None:
    """`--set k=$VAR` with VAR unset: data.cache_dir= staged into the current directory and
    launch.slurm.container= rendered `apptainer exec '' hpcpipe`."""
    with pytest.raises(
        ConfigError, match=rf"^tiny: {re.escape(key)}: String should have at least 1 character"
    ):
        load_config("tiny", [f"{key}="])


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["train.stepz=3"], "unknown config key 'train.stepz'"),
        (["trian.steps=3"], "unknown config key 'trian.steps'"),
        (["train.steps=many"], "train.steps"),
        (["train.precision=fp8"], "train.precision"),
        (["model.d_model=100", "model.n_heads=3"], "model.d_model (100) must be divisible"),
        (["train.steps"], "expected section.key=value"),
        (["run.name=../escape"], "run.name must be a plain directory name"),
    ],
)
def test_bad_overrides_name_the_key(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("tiny", overrides)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["model.variant=gpt2"], "model.variant 'gpt2' does not fit run.recipe 'lora-function-calling'"),
        (["data.format=tokens"], "data.format 'tokens' does not fit run.recipe 'lora-function-calling'"),
        (["model.name_or_path="], "model.name_or_path: String should have at least 1 character"),
        (["lora.r=0"], "lora.r"),
        (["model.base_dtype=fp16"], "model.base_dtype"),
        (["lora.top_layers=0"], "lora.top_layers"),
        (["lora.calibration_target=1.5"], "lora.calibration_target"),
        (["lora.frozen_context=true", "model.gradient_checkpointing=true"], "lora.frozen_context needs"),
    ],
)
def test_lora_recipe_config_errors_name_the_key(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("lora-fc-tiny", overrides)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_seed_qwen2_7b_configuration_validates_as_written() -> None:
    cfg = load_config("lora-fc-qwen2-7b")
    assert (cfg.lora.r, cfg.lora.alpha, cfg.model.seq_len, cfg.train.lr) == (64, 128, 4096, 2e-5)
    assert cfg.model.base_dtype == "bf16" and cfg.train.precision == "bf16"
    assert cfg.parallel.strategy == "fsdp" and cfg.train.schedule == "cosine"
    assert grad_accum_steps(cfg.train, world_size=16) == 4  # 2 per GPU x accumulation 4 on 2 x 8


def test_unknown_key_in_yaml_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"train": {"steps": 3, "learning_rate": 0.1}}))
    with pytest.raises(ConfigError, match=r"unknown config key 'train.learning_rate'"):
        load_config(path)


def test_missing_file_and_unknown_preset(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        load_config("nope")


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  steps: [1,\n")
    with pytest.raises(ConfigError, match=r"bad.yaml \(line \d+\): not valid YAML"):
        load_config(path)


def test_a_repeated_key_or_an_empty_file_is_refused(tmp_path: Path) -> None:
    """safe_load kept the last of two `train:` sections and trained with all defaults on an empty file."""
    path = tmp_path / "job.yaml"
    path.write_text("train:\n  steps: 3\nmodel:\n  d_model: 64\ntrain:\n  lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"job.yaml \(line 5\): not valid YAML: key 'train' appears twice"):
        load_config(path)
    path.write_text("train:\n  steps: 3\n  steps: 4\n")
    with pytest.raises(ConfigError, match=r"\(line 3\): not valid YAML: key 'steps' appears twice"):
        load_config(path)
    path.write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match=r"job.yaml: the job file is empty"):
        load_config(path)
    path.write_text("train:\n  <<: {steps: 3, lr: 0.1}\n  steps: 5\n")  # a merge may be overridden
    assert load_config(path).train.steps == 5


@pytest.mark.parametrize("key", ["train.steps", "train.lr", "parallel.timeout_s", "train.grad_clip"])
def test_true_or_false_for_a_number_is_refused(key: str) -> None:
    """pydantic reads true as 1: `train.steps=true` trained one step."""
    with pytest.raises(ConfigError, match=rf"{key}: expected a number, not true or false \(got True\)"):
        load_config("tiny", [f"{key}=true"])
    assert load_config("tiny", ["checkpoint.async=true"]).checkpoint.async_save is True


def test_grad_accum_arithmetic() -> None:
    train = JobConfig().train.model_copy(update={"micro_batch_size": 4, "global_batch_size": 32})
    assert grad_accum_steps(train, 1) == 8
    assert grad_accum_steps(train, 2) == 4
    with pytest.raises(ConfigError, match=r"train.global_batch_size \(32\) must be a multiple"):
        grad_accum_steps(train, 3)


def test_recipe_variant_and_data_format_must_agree() -> None:
    with pytest.raises(ConfigError, match=r"model\.variant 'llama' does not fit run\.recipe 'resnet-cifar'"):
        load_config("resnet-tiny", ["model.variant=llama"])
    with pytest.raises(ConfigError, match=r"data\.format 'tokens' does not fit run\.recipe 'resnet-cifar'"):
        load_config("resnet-tiny", ["data.format=tokens"])
    with pytest.raises(ConfigError, match=r"data\.format 'idx' does not fit run\.recipe 'gpt'"):
        load_config("tiny", ["data.format=idx"])


def test_a_profile_warm_up_longer_than_its_start_step_is_refused_at_load() -> None:
    """skip_first went negative: torch.profiler's AssertionError ended training after step 0."""
    key = r"^tiny: observe\.profile\.warmup: "
    with pytest.raises(ConfigError, match=key + r"more warm-up steps than start_step \(1\)"):
        load_config("tiny", ["observe.profile.start_step=1", "observe.profile.warmup=3"])
    as_many = load_config("tiny", ["observe.profile.start_step=3", "observe.profile.warmup=3"])
    assert as_many.observe.profile.warmup == 3
    nsys = load_config(
        "tiny", ["observe.profile.tool=nsys", "observe.profile.start_step=1", "observe.profile.warmup=3"]
    )
    assert nsys.observe.profile.warmup == 3  # nsys and ncu capture no warm-up


def test_loader_worker_options_need_workers() -> None:
    with pytest.raises(ConfigError, match=r"data.persistent_workers needs data.num_workers > 0"):
        load_config("resnet-tiny", ["data.persistent_workers=true"])
    sets = ["data.num_workers=2", "data.prefetch_factor=4", "parallel.bucket_cap_mb=50"]
    cfg = load_config("resnet-tiny", sets)
    assert cfg.data.prefetch_factor == 4 and cfg.parallel.bucket_cap_mb == 50.0


def test_epochs_become_steps() -> None:
    from hpcpipe.train.schedule import resolve_steps

    cfg = load_config("resnet-tiny", ["train.epochs=2.5"]).train
    assert resolve_steps(cfg, samples_per_epoch=100).steps == 16  # ceil(2.5 * 100 / 16)
    with pytest.raises(ConfigError, match=r"train\.epochs"):
        resolve_steps(cfg, samples_per_epoch=None)


def test_the_training_hash_changes_with_what_is_trained_only() -> None:
    base = load_config("tiny").training_hash()
    same = ["checkpoint.every_steps=3", "observe.log_every=1", "parallel.rdzv_last_call_s=5", "run.name=x"]
    same += ["parallel.rdzv_keep_alive_s=0.25", "parallel.rdzv_keep_alive_misses=4"]
    assert load_config("tiny", same).training_hash() == base
    for changed in ("train.lr=0.1", "parallel.nproc=2", "run.seed=1", "data.vocab_size=512"):
        assert load_config("tiny", [changed]).training_hash() != base, changed


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        (1, "a crash"),
        (2, "a user error"),
        (3, "a hang"),
        (4, "lost"),
        (76, "pruned"),
        (130, "signal 2"),
        (128, "signal 0"),
        (143, "signal 15"),
    ],
)
def test_a_preempt_exit_code_that_means_something_else_is_refused(code: int, needle: str) -> None:
    """A preemption answered 130 or 2 read as Ctrl-C or a user error: never requeued."""
    with pytest.raises(ConfigError, match=f"fault.preempt_exit_code: {code} .*{needle}"):
        load_config("tiny", [f"fault.preempt_exit_code={code}"])
    assert load_config("tiny", ["fault.preempt_exit_code=85"]).fault.preempt_exit_code == 85


def test_the_reserved_exit_codes_are_the_projects() -> None:
    from hpcpipe.config.fault import RESERVED_EXIT_CODES
    from hpcpipe.errors import USER_ERROR_EXIT_CODE
    from hpcpipe.launch.exit import PEER_LOST_EXIT_CODE
    from hpcpipe.observe.watchdog import HANG_EXIT_CODE
    from hpcpipe.train.trial import PRUNED_EXIT_CODE

    assert set(RESERVED_EXIT_CODES) == {
        1,
        USER_ERROR_EXIT_CODE,
        HANG_EXIT_CODE,
        PEER_LOST_EXIT_CODE,
        PRUNED_EXIT_CODE,
    }


def test_a_recorded_exponent_is_not_named_as_a_change(tmp_path: Path) -> None:
    from hpcpipe.config.changes import changed_keys

    job = load_config("tiny", ["train.lr=0.001"])
    recorded = tmp_path / "config.yaml"
    recorded.write_text(job.to_yaml().replace("lr: 0.001", "lr: 1e-3"))
    assert "lr: 1e-3" in recorded.read_text()
    assert changed_keys(recorded, job) == []  # it was ["train.lr '1e-3' -> 0.001"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("data.cache_dir", "/tmp/job-1234"),  # a per-job $TMPDIR
        ("data.num_workers", "2"),
        ("data.pin_memory", "true"),
        ("data.prepared_dir", "/scratch/prepared"),
        ("parallel.strategy", "ddp"),
        ("parallel.nproc", "2"),
        ("parallel.timeout_s", "60"),
        ("train.compile", "true"),
        ("train.activation_checkpointing", "full"),
    ],
)
def test_where_and_how_fast_a_run_trains_is_no_training_change(key: str, value: str) -> None:
    """Every key under data and parallel counted: a finished run given a per-job cache_dir, more
    loader workers or another strategy was refused (exit 2), where it had been a no-op."""
    from hpcpipe.config.changes import training_changes

    before = load_config("tiny").to_dict()
    assert training_changes(before, load_config("tiny", [f"{key}={value}"]).to_dict()) == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("train.lr", "0.5"),
        ("data.max_bytes", "1000"),
        ("data.vocab_size", "300"),
        ("parallel.sync_gradients", "false"),
        ("parallel.broadcast_buffers", "true"),
    ],
)
def test_what_a_run_trains_or_on_which_data_is_a_training_change(key: str, value: str) -> None:
    from hpcpipe.config.changes import training_changes

    before = load_config("tiny").to_dict()
    (change,) = training_changes(before, load_config("tiny", [f"{key}={value}"]).to_dict())
    assert change.startswith(f"{key} ")
