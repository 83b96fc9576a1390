"""The pre-trained ``@tiny-llama`` ships with hpcpipe while it is what the code builds, and is
otherwise built once per machine (``fsutil.machine_cache_dir``): a run in a new directory copies it
instead of pre-training for minutes again, and the copy is the same model. Pre-training itself runs
here for two short steps, so it stays covered although no run pre-trains the real one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from hpcpipe.models import tiny_lm

pytestmark = pytest.mark.timeout(120)

TEXTS = [f"def f{i}(x):\n    return x + {i}\n" for i in range(60)]
PRETRAIN = [f"USER: add {i} and {i + 1}\nASSISTANT: <functioncall> add({i}, {i + 1})" for i in range(60)]


@pytest.fixture
def short_pretraining(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HPCPIPE_CACHE_DIR", str(tmp_path / "cache"))
    for name, value in (("_PRETRAIN_STEPS", 2), ("_PRETRAIN_BATCH", 2), ("_PRETRAIN_LEN", 32)):
        monkeypatch.setattr(tiny_lm, name, value)
    return tmp_path / "cache" / "models"


def _never(*_args: object) -> None:
    raise AssertionError("pre-trained again")


def test_a_second_directory_copies_the_machines_model(
    tmp_path: Path, short_pretraining: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = tiny_lm.tiny_llama_dir(tmp_path / "a", TEXTS, seed=0, pretrain_texts=PRETRAIN)
    random = tiny_lm.tiny_llama_dir(tmp_path / "r", TEXTS, seed=0)
    trained, untrained = load_file(first / "model.safetensors"), load_file(random / "model.safetensors")
    assert any(not trained[k].equal(untrained[k]) for k in trained)  # pre-training changed weights
    [kept] = short_pretraining.glob(f"{first.name}-*")  # the inputs' hash, then the build's stamp
    assert (kept / "model.safetensors").is_file()
    assert not list(short_pretraining.glob(f"{random.name}*"))  # built in a second: not kept

    monkeypatch.setattr(tiny_lm, "_pretrain", _never)
    second = tiny_lm.tiny_llama_dir(tmp_path / "b", TEXTS, seed=0, pretrain_texts=PRETRAIN)
    assert second.name == first.name
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (second / name).read_bytes() == (first / name).read_bytes(), name


def test_another_transformers_version_pretrains_again(
    tmp_path: Path, short_pretraining: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    tiny_lm.tiny_llama_dir(tmp_path / "a", TEXTS, seed=0, pretrain_texts=PRETRAIN)
    monkeypatch.setattr(transformers, "__version__", "0.0.0")  # the weights it would build may differ
    monkeypatch.setattr(tiny_lm, "_pretrain", _never)
    with pytest.raises(AssertionError, match="pre-trained again"):
        tiny_lm.tiny_llama_dir(tmp_path / "b", TEXTS, seed=0, pretrain_texts=PRETRAIN)


def test_an_empty_cache_setting_turns_it_off(
    tmp_path: Path, short_pretraining: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny_lm.tiny_llama_dir(tmp_path / "a", TEXTS, seed=0, pretrain_texts=PRETRAIN)
    monkeypatch.setenv("HPCPIPE_CACHE_DIR", "")
    monkeypatch.setattr(tiny_lm, "_pretrain", _never)
    with pytest.raises(AssertionError, match="pre-trained again"):
        tiny_lm.tiny_llama_dir(tmp_path / "b", TEXTS, seed=0, pretrain_texts=PRETRAIN)


def test_where_the_machine_cache_lives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcpipe.fsutil import machine_cache_dir

    monkeypatch.delenv("HPCPIPE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert machine_cache_dir() == tmp_path / "xdg" / "hpcpipe"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert machine_cache_dir() == tmp_path / "home" / ".cache" / "hpcpipe"
    monkeypatch.setenv("HPCPIPE_CACHE_DIR", str(tmp_path / "mine"))
    assert machine_cache_dir() == tmp_path / "mine"


def test_the_shipped_base_is_the_one_this_code_builds() -> None:
    name = tiny_lm.default_tiny_name(pretrained=True)
    assert tiny_lm.shipped_copy(name) is not None, (
        f"{tiny_lm.SHIPPED} holds no current {name}: its inputs or the code that builds it changed; "
        "run `python scripts/build_tiny_llama.py` and commit the result"
    )
    built = json.loads((tiny_lm.SHIPPED / name / "BUILD.json").read_text())
    assert {"built", "cpu", "torch", "seconds"} <= set(built)  # where it came from


def test_a_new_directory_copies_the_shipped_base_without_pretraining(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCPIPE_CACHE_DIR", "")
    monkeypatch.setattr(tiny_lm, "_pretrain", _never)
    out = tiny_lm.default_tiny_dir(tmp_path / "prepared", pretrained=True)
    shipped = tiny_lm.SHIPPED / out.name
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (out / name).read_bytes() == (shipped / name).read_bytes(), name


def test_a_shipped_copy_another_code_built_is_not_used(
    tmp_path: Path, short_pretraining: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = tiny_lm.model_name(TEXTS, 0, PRETRAIN)
    monkeypatch.setattr(tiny_lm, "SHIPPED", tmp_path / "shipped")
    fake = tmp_path / "shipped" / name
    fake.mkdir(parents=True)
    shutil.copytree(tiny_lm.tiny_llama_dir(tmp_path / "r", TEXTS, seed=0), fake, dirs_exist_ok=True)
    (fake / "BUILD.json").write_text(json.dumps({"code": "another builder"}))
    assert tiny_lm.shipped_copy(name) is None
    built = tiny_lm.tiny_llama_dir(tmp_path / "a", TEXTS, seed=0, pretrain_texts=PRETRAIN)  # pre-trains
    assert (built / "model.safetensors").read_bytes() != (fake / "model.safetensors").read_bytes()
    (fake / "BUILD.json").write_text(json.dumps({"code": tiny_lm.build_code_stamp()}))
    assert tiny_lm.shipped_copy(name) == fake
    monkeypatch.setattr(tiny_lm, "_pretrain", _never)
    copied = tiny_lm.tiny_llama_dir(tmp_path / "b", TEXTS, seed=0, pretrain_texts=PRETRAIN)
    assert (copied / "model.safetensors").read_bytes() == (fake / "model.safetensors").read_bytes()
