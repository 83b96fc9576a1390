"""parallel.strategy=deepspeed: the merge of hpcpipe's settings into a user's ds_config.json, the
checks that refuse what cannot work (one line, exit 2), the offload memory check, the manifest's
engine field and the safe loading of DeepSpeed's files. The engine itself: tests/distributed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.helpers import run_cli

from hpcpipe.checkpoint.deepspeed_io import owner_rank, safe_torch_load
from hpcpipe.checkpoint.manifest import CheckpointError, FileEntry, Manifest
from hpcpipe.config import load_config
from hpcpipe.errors import ConfigError
from hpcpipe.train import deepspeed as ds_engine
from hpcpipe.train.deepspeed import check_offload_memory, is_engine
from hpcpipe.train.deepspeed_config import deepspeed_settings


def _job(*sets: str):  # type: ignore[no-untyped-def]
    return load_config("tiny", ["parallel.strategy=deepspeed", *sets])


def _write(tmp: Path, body: object, name: str = "ds_config.json") -> str:
    path = tmp / name
    path.write_text(json.dumps(body))
    return str(path)


def test_without_a_file_the_job_decides_everything() -> None:
    job = _job("train.precision=bf16")
    settings = deepspeed_settings(job, world_size=2, accum=2)
    cfg = settings.config
    assert cfg["train_micro_batch_size_per_gpu"] == job.train.micro_batch_size
    assert cfg["gradient_accumulation_steps"] == 2
    assert cfg["train_batch_size"] == job.train.micro_batch_size * 2 * 2
    assert cfg["zero_optimization"] == {"stage": 3}
    assert cfg["bf16"] == {"enabled": True} and cfg["fp16"] == {"enabled": False}
    assert cfg["gradient_clipping"] == job.train.grad_clip
    assert settings.notes == []


def test_a_users_file_keeps_its_knobs_and_names_what_hpcpipe_overrides(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
            "scheduler": {"type": "WarmupLR"},
            "bf16": {"enabled": True},
            "gradient_clipping": 0.3,
            "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 5e8},
        },
    )
    settings = deepspeed_settings(_job(f"parallel.deepspeed_config={path}"), world_size=2, accum=4)
    cfg = settings.config
    assert "optimizer" not in cfg and "scheduler" not in cfg
    assert cfg["zero_optimization"] == {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 5e8}
    assert cfg["bf16"]["enabled"] is False  # train.precision=fp32 (the tiny preset) wins
    notes = " | ".join(settings.notes)
    for named in ("'optimizer' ignored", "'scheduler' ignored", "bf16.enabled=True", "gradient_clipping=0.3"):
        assert named in notes


def test_the_jobs_zero_keys_win_when_set(tmp_path: Path) -> None:
    path = _write(tmp_path, {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})
    settings = deepspeed_settings(
        _job(f"parallel.deepspeed_config={path}", "parallel.zero_stage=3", "parallel.offload_optimizer=none"),
        world_size=2,
        accum=1,
    )
    assert settings.stage == 3 and not settings.offloads_optimizer
    assert any("stage=2 overridden by parallel.zero_stage" in note for note in settings.notes)


def test_accumulation_steps_that_differ_at_this_world_size_are_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, {"gradient_accumulation_steps": 8})
    with pytest.raises(
        ConfigError, match=r"gradient_accumulation_steps=8 in parallel.deepspeed_config differs .* 2"
    ):
        deepspeed_settings(_job(f"parallel.deepspeed_config={path}"), world_size=2, accum=2)


def test_an_inline_mapping_is_accepted() -> None:
    job = _job("parallel.deepspeed_config={zero_optimization: {stage: 1}}")
    assert deepspeed_settings(job, world_size=2, accum=1).stage == 1


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (["parallel.zero_stage=4"], "parallel.zero_stage"),
        (["parallel.deepspeed_config=bad.json"], "bad.json is not JSON"),
        (["parallel.deepspeed_config=missing.json"], "cannot read missing.json"),
        (
            ["parallel.deepspeed_config=batch.json"],
            "train_batch_size=64 differs from train.global_batch_size=8",
        ),
        (["parallel.offload_params=cpu", "parallel.zero_stage=2"], "parallel.offload_params needs"),
        (["checkpoint.async=true"], "checkpoint.async is not available"),
        (["fault.oom_recovery=true"], "fault.oom_recovery cannot work"),
        (["parallel.nnodes=1:2"], "elastic range"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, sets: list[str], says: str) -> None:
    (tmp_path / "bad.json").write_text('{"zero_optimization": ')
    (tmp_path / "batch.json").write_text('{"train_batch_size": 64}')
    args = [arg for s in ["parallel.strategy=deepspeed", *sets] for arg in ("--set", s)]
    proc = run_cli("train", "tiny", "--nproc", "2", *args, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


def test_offload_that_does_not_fit_in_host_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Linear(1000, 1000)  # ~1M parameters: 16 MB of offloaded optimizer state
    settings = deepspeed_settings(_job("parallel.offload_optimizer=cpu"), world_size=2, accum=1)
    monkeypatch.setattr(ds_engine, "_host_available_bytes", lambda: 4 * 2**20)
    with pytest.raises(ConfigError, match=r"offload_optimizer=cpu: this node's 2 rank\(s\) would keep"):
        check_offload_memory(settings, model, world_size=2, local_ranks=2)
    monkeypatch.setattr(ds_engine, "_host_available_bytes", lambda: 64 * 2**20)
    check_offload_memory(settings, model, world_size=2, local_ranks=2)


def test_oom_recovery_defaults_off_under_deepspeed_pipelines_and_tensor_parallelism() -> None:
    from hpcpipe.train.oom import oom_recovery_on

    assert _job().fault.oom_recovery is None
    assert not oom_recovery_on(_job().fault.oom_recovery, "deepspeed")
    for strategy in ("single", "ddp", "fsdp"):
        assert oom_recovery_on(None, strategy)
        assert not oom_recovery_on(None, strategy, pipeline=True)
        assert not oom_recovery_on(None, strategy, tensor_parallel=True)
    assert load_config("tiny", ["fault.oom_recovery=false"]).fault.oom_recovery is False
    assert not oom_recovery_on(False, "ddp")


def test_one_process_refuses_deepspeed_rather_than_train_without_it() -> None:
    from hpcpipe.train.parallel import resolve_strategy

    with pytest.raises(ConfigError, match=r"deepspeed needs 2 or more ranks"):
        resolve_strategy("deepspeed", 1)
    assert resolve_strategy("deepspeed", 2) == "deepspeed" and resolve_strategy("fsdp", 1) == "single"


def test_a_config_file_is_inlined_so_every_node_and_the_training_hash_see_it(tmp_path: Path) -> None:
    path = _write(tmp_path, {"zero_optimization": {"stage": 2}})
    job = _job(f"parallel.deepspeed_config={path}")
    assert job.parallel.deepspeed_config == {"zero_optimization": {"stage": 2}}
    Path(path).write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    assert _job(f"parallel.deepspeed_config={path}").training_hash() != job.training_hash()
    again = load_config(_save(tmp_path, job))  # the run's config.yaml, without the file
    Path(path).unlink()
    assert again.parallel.deepspeed_config == {"zero_optimization": {"stage": 2}}


def _save(tmp: Path, job) -> Path:  # type: ignore[no-untyped-def]
    out = tmp / "config.yaml"
    out.write_text(job.to_yaml())
    return out


def test_a_non_mapping_offload_block_is_one_line() -> None:
    job = _job("parallel.deepspeed_config={zero_optimization: {offload_optimizer: cpu}}")
    with pytest.raises(ConfigError, match=r"zero_optimization.offload_optimizer must be a mapping"):
        deepspeed_settings(job, world_size=2, accum=1)


def test_manifest_records_the_engine_and_dcp_manifests_stay_as_they_were() -> None:
    files = {"a": FileEntry("00", 1)}
    dcp = Manifest(5, 2, "h", files)
    assert "engine" not in json.loads(dcp.to_json())
    assert Manifest.from_json(dcp.to_json()).engine == "dcp"
    ds = Manifest(5, 2, "h", files, engine="deepspeed")
    assert Manifest.from_json(ds.to_json()).engine == "deepspeed"
    body = json.loads(ds.to_json()) | {"engine": "megatron"}
    with pytest.raises(ValueError, match="unknown checkpoint engine"):
        Manifest.from_json(json.dumps(body))


def test_each_rank_owns_its_zero_shards_and_rank_0_the_rest() -> None:
    assert owner_rank("deepspeed/global_step4/zero_pp_rank_3_mp_rank_00_optim_states.pt") == 3
    assert owner_rank("deepspeed/global_step4/bf16_zero_pp_rank_12_mp_rank_00_optim_states.pt") == 12
    assert owner_rank("deepspeed/latest") == 0 and owner_rank("deepspeed/zero_to_fp32.py") == 0


class Payload:  # any class outside DeepSpeed's allow-list stands for a crafted pickle
    pass


def test_deepspeed_files_are_read_without_running_pickles(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save({"module": {"w": torch.ones(2)}, "ds_version": "0.19.8"}, good)
    torch.save({"module": Payload()}, bad)
    assert safe_torch_load(good)["ds_version"] == "0.19.8"
    with pytest.raises(CheckpointError, match=r"bad.pt: unsafe or corrupt DeepSpeed state .*Payload"):
        safe_torch_load(bad)


def test_plain_modules_are_not_engines() -> None:
    assert not is_engine(torch.nn.Linear(2, 2))


def test_the_qwen2_7b_zero3_twin_matches_the_fsdp_preset_and_the_seeds_layout() -> None:
    """2 nodes x 8 GPUs, 2 per GPU x accumulation 4 = 128; everything but parallel and the
    checkpoint's sync save is the FSDP2 preset's."""
    from hpcpipe.config import grad_accum_steps

    twin, fsdp = load_config("lora-fc-qwen2-7b-zero3"), load_config("lora-fc-qwen2-7b")
    for section in ("model", "data", "lora", "train"):
        assert getattr(twin, section) == getattr(fsdp, section), section
    assert (twin.parallel.nnodes, twin.parallel.nproc) == ("2", 8)
    accum = grad_accum_steps(twin.train, world_size=16)
    settings = deepspeed_settings(twin, world_size=16, accum=accum)
    cfg = settings.config
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], accum) == (128, 2, 4)
    assert settings.stage == 3 and cfg["bf16"]["enabled"] and cfg["gradient_clipping"] == twin.train.grad_clip
    assert cfg["zero_optimization"]["overlap_comm"] and settings.notes == []


def test_a_checkpoint_resumes_only_under_the_engine_and_world_size_that_wrote_it(tmp_path: Path) -> None:
    from hpcpipe.checkpoint.deepspeed_io import check_resumable

    check_resumable(tmp_path, "deepspeed", 2, "deepspeed", 2)
    check_resumable(tmp_path, "dcp", 2, "dcp", 1)  # DCP reshards
    with pytest.raises(CheckpointError, match=r"written by DCP .* parallel.strategy=deepspeed"):
        check_resumable(tmp_path, "dcp", 2, "deepspeed", 2)
    with pytest.raises(CheckpointError, match=r"written by DeepSpeed, .* parallel.strategy=ddp/fsdp/single"):
        check_resumable(tmp_path, "deepspeed", 2, "dcp", 2)
    with pytest.raises(CheckpointError, match=r"ZeRO state of 2 ranks cannot load into 4; resume with 2"):
        check_resumable(tmp_path, "deepspeed", 2, "deepspeed", 4)


def test_train_precision_and_the_optimizer_win_over_the_files_legacy_and_autocast_keys() -> None:
    """torch_autocast trained an fp32 run under bf16; zero_optimization: false ran ZeRO-3; the
    forced optimizer keys were overridden without the note the docs promise."""
    given = {
        "torch_autocast": {"enabled": True, "dtype": "torch.bfloat16"},
        "zero_optimization": False,
        "zero_force_ds_cpu_optimizer": True,
    }
    settings = deepspeed_settings(
        _job(f"parallel.deepspeed_config={json.dumps(given)}"), world_size=2, accum=2
    )
    assert settings.config["torch_autocast"]["enabled"] is False
    assert settings.stage == 0 and settings.config["zero_force_ds_cpu_optimizer"] is False
    notes = " ".join(settings.notes)
    assert (
        "torch_autocast.enabled overridden" in notes
        and "zero_force_ds_cpu_optimizer=True overridden" in notes
    )
    with pytest.raises(ConfigError, match="zero_optimization='x' is not a mapping"):
        deepspeed_settings(
            _job('parallel.deepspeed_config={"zero_optimization": "x"}'), world_size=2, accum=2
        )


def test_deepspeeds_own_config_refusals_are_one_line() -> None:
    """DeepSpeedConfigError and its config parser's asserts were a traceback and exit 1."""
    from hpcpipe.train.deepspeed import _a_config_refusal

    class DeepSpeedConfigError(Exception):
        pass

    assert _a_config_refusal(DeepSpeedConfigError("NVIDIA Apex AMP integration has been removed"))
    assert not _a_config_refusal(RuntimeError("CUDA out of memory"))
