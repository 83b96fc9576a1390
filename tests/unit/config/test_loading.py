"""Bad job input, each one line naming the key or file: alias bombs and self-references, deep
nesting, over-long names, out-of-range seeds, YAML 1.1 numbers, the order of --set flags, a
mapping given for a section."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest

from hpcpipe.config import apply_values, load_config
from hpcpipe.errors import ConfigError, path_error
from hpcpipe.yamlfile import load_yaml_text, read_yaml_file


def _job(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_an_alias_bomb_is_one_short_line(tmp_path: Path) -> None:
    """305 bytes expanded to a 35 MB error line (nine levels ran for minutes)."""
    levels = ["a: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"b{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    text = "x:\n" + "".join(f"  {line}\n" for line in levels) + "run: {name: *l8}\n"
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        load_config(_job(tmp_path, text))
    message = str(caught.value)
    assert len(message) < 400 and "job.yaml: not valid YAML: its aliases expand" in message
    assert time.monotonic() - started < 10


def test_an_alias_bomb_where_any_value_goes_is_refused_as_it_is_read(tmp_path: Path) -> None:
    """parallel.deepspeed_config takes any mapping: seven levels took 22 s and 1.5 GB to load and
    hash; anchors, aliases and merge keys of an ordinary size still read."""
    levels = ["a: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"b{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 8)]
    text = "parallel:\n  deepspeed_config:\n" + "".join(f"    {line}\n" for line in levels)
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"job\.yaml: not valid YAML: its aliases expand to more than"):
        load_config(_job(tmp_path, text))
    assert time.monotonic() - started < 2
    shared = "ds: {a: &base {x: 1, y: 2}, b: {<<: *base, y: 3}}\n"
    assert read_yaml_file(_job(tmp_path, shared)) == {"ds": {"a": {"x": 1, "y": 2}, "b": {"x": 1, "y": 3}}}
    job = load_config(_job(tmp_path, "run: {name: &n a}\nparallel: {deepspeed_config: {tag: *n}}\n"))
    assert job.parallel.deepspeed_config == {"tag": "a"}


def test_self_references_and_deep_nesting_are_named(tmp_path: Path) -> None:
    # A RecursionError traceback quoting the value (128 KB); now one line naming the key.
    with pytest.raises(ConfigError, match=r"train\.steps: Input should be a valid integer \(got \[\[\["):
        load_config(_job(tmp_path, "train: {steps: &a [*a]}\n"))
    with pytest.raises(ConfigError, match=r"train\.steps: Input should be a valid integer"):
        load_config("tiny", ["train.steps=&a [*a]"])
    with pytest.raises(ConfigError, match=r"job\.yaml: not valid YAML: nested too deeply"):
        load_config(_job(tmp_path, "train: " + "[" * 5000 + "]" * 5000 + "\n"))


def test_names_and_seeds_the_system_cannot_take_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"run\.name is 300 bytes long; at most 200"):
        load_config("tiny", ["run.name=" + "b" * 300])
    with pytest.raises(ConfigError, match=r"run\.seed"):  # torch.manual_seed overflowed in the worker
        load_config("tiny", ["run.seed=18446744073709551616"])
    with pytest.raises(ConfigError, match=r"hpo\.seed"):  # it blamed hpo.storage
        load_config("tiny", ["hpo.seed=-5"])
    too_long = OSError(errno.ENAMETOOLONG, "File name too long", "runs/" + "b" * 300)
    error = path_error(too_long)
    assert error is not None and str(error).endswith(": File name too long")


def test_numbers_read_as_yaml_1_2_reads_them(tmp_path: Path) -> None:
    """YAML 1.1: 010 was octal (8 steps) and 1:30 base 60 (90), without a word."""
    assert load_config("tiny", ["train.steps=010"]).train.steps == 10
    assert load_config(_job(tmp_path, "train: {steps: 010}\n")).train.steps == 10
    with pytest.raises(ConfigError, match=r"train\.steps"):
        load_config("tiny", ["train.steps=1:30"])


@pytest.mark.parametrize(
    ("text", "value"), [("1e-3", 0.001), ("5e8", 5e8), ("-2.5E+3", -2500.0), ("1.5e3", 1500.0)]
)
def test_floats_read_as_yaml_1_2_reads_them(text: str, value: float) -> None:
    """YAML 1.1 wants a dot and a signed exponent: 1e-3 and 5e8 were strings."""
    assert load_yaml_text(text) == value and isinstance(load_yaml_text(text), float)
    assert load_config("tiny", [f"train.lr={text.lstrip('-')}"]).train.lr == abs(value)


def test_text_that_only_starts_as_a_float_stays_text_and_inf_is_still_refused(tmp_path: Path) -> None:
    assert load_yaml_text("1e3abc") == "1e3abc" and load_yaml_text("10") == 10
    assert load_yaml_text(".inf") == float("inf")
    with pytest.raises(ConfigError, match=r"train\.lr"):
        load_config(_job(tmp_path, "train: {lr: .inf}\n"))
    job = load_config(
        _job(tmp_path, "hpo:\n  space:\n    train.lr: {type: categorical, choices: [1e-4, 3e-4]}\n")
    )
    assert job.hpo.space["train.lr"].choices == [1e-4, 3e-4]


def test_recipe_keys_may_come_before_the_recipe_that_takes_them() -> None:
    sets = ["recipe.finetune=full", "run.recipe=hf-causal-lm", "model.variant=hf-causal-lm"]
    job = load_config("tiny", [*sets, "model.name_or_path=@tiny-llama-random"])
    assert job.run.recipe == "hf-causal-lm" and job.recipe["finetune"] == "full"


def test_a_directory_given_as_a_job_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "somedir.yaml").mkdir()
    with pytest.raises(ConfigError, match="a directory, not a job file"):
        load_config(str(tmp_path / "somedir.yaml"))


@pytest.mark.parametrize("spelling", ["async_save", "async"])
def test_either_spelling_of_an_aliased_key_sets_it_on_a_preset_or_a_saved_config(
    tmp_path: Path, spelling: str
) -> None:
    """A saved config.yaml says ``async:``; ``--set checkpoint.async_save=...`` added a second key
    for the field: "unknown config key 'checkpoint.async_save'"."""
    saved = _job(tmp_path, load_config("tiny").to_yaml())
    for source in ("tiny", str(saved)):
        assert load_config(source, [f"checkpoint.{spelling}=true"]).checkpoint.async_save is True
    on = _job(tmp_path, "checkpoint: {async: true}\n")
    assert load_config(on, [f"checkpoint.{spelling}=false"]).checkpoint.async_save is False
    assert apply_values(load_config("tiny"), {f"checkpoint.{spelling}": True}).checkpoint.async_save is True


def test_a_mapping_for_a_section_sets_its_keys_and_keeps_the_rest(tmp_path: Path) -> None:
    """--set 'train={lr: 0.01}' replaced the section: the job's train.steps 20 became the
    default 100, without a word; subsections merge too, a free-form dict is replaced."""
    job = load_config("tiny", ["train={lr: 0.01}"])
    assert (job.train.lr, job.train.steps) == (0.01, load_config("tiny").train.steps)
    text = "launch: {slurm: {partition: gpu, time: '01:00:00'}}\nparallel: {deepspeed_config: {a: 1}}\n"
    sets = ["launch={slurm: {time: '02:00:00'}}", "parallel={deepspeed_config: {b: 2}}"]
    job = load_config(_job(tmp_path, text), sets)
    assert (job.launch.slurm.partition, job.launch.slurm.time) == ("gpu", "02:00:00")
    assert job.parallel.deepspeed_config == {"b": 2}
    saved = _job(tmp_path, load_config("tiny").to_yaml())  # holds async:, given async_save here
    assert load_config(saved, ["checkpoint={async_save: true}"]).checkpoint.async_save is True


def test_a_saved_config_reads_back_with_strings_that_look_like_yaml_1_2_floats(tmp_path: Path) -> None:
    """The YAML 1.1 writer left '64e9' and '1e3' bare (strings to it), which the YAML 1.2 reader
    takes as floats: the run's own config.yaml failed to load ("Input should be a valid string")."""
    sets = ["launch.k8s.memory=64e9", "launch.slurm.account=1e3", "run.name=5e-1"]
    job = load_config("tiny", sets)
    assert (job.launch.k8s.memory, job.launch.slurm.account, job.run.name) == ("64e9", "1e3", "5e-1")
    saved = _job(tmp_path, job.to_yaml())
    assert load_config(saved).to_dict() == job.to_dict()


def test_written_yaml_reads_the_same_to_a_yaml_1_1_reader() -> None:
    """Other tools read config.yaml and the Helm values with yaml.safe_load (YAML 1.1): a bare
    base-60 float ('1:30.5') was 90.5 to them."""
    import yaml

    from hpcpipe.yamlfile import dump_yaml

    values = {"a": "1:30.5", "b": "190:20:30.15", "c": "1e3", "d": "010", "e": 1.5, "f": "x"}
    text = dump_yaml(values)
    assert yaml.safe_load(text) == values == load_yaml_text(text)
