"""Manifests, verification problems, retention arithmetic, the durable schedule, config keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcpipe.checkpoint.manifest import (
    FileEntry,
    Manifest,
    hash_file,
    parse_step,
    step_dir_name,
    verify_dir,
    write_manifest,
)
from hpcpipe.checkpoint.tiers import DurableSchedule, retained_steps
from hpcpipe.config import load_config
from hpcpipe.errors import ConfigError


def _checkpoint(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    entries = {name: hash_file(root / name) for name in files}
    write_manifest(root, Manifest(step=3, world_size=2, config_hash="h", files=entries))
    return root


def test_manifest_round_trip_and_verify(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, {"a.distcp": b"x" * 100, "extra/rank-00000.pt": b"y"})
    manifest, problems = verify_dir(ckpt)
    assert problems == [] and manifest is not None
    assert manifest.step == 3 and manifest.world_size == 2 and manifest.total_bytes == 101
    assert manifest.files["a.distcp"] == FileEntry(hash_file(ckpt / "a.distcp").digest, 100)


def test_each_kind_of_damage_names_the_file(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, {"a": b"a" * 10, "b": b"b" * 10, "c": b"c" * 10})
    (ckpt / "a").write_bytes(b"a" * 9)
    (ckpt / "b").write_bytes(b"B" + b"b" * 9)
    (ckpt / "c").unlink()
    (ckpt / "stray").write_bytes(b"?")
    _, problems = verify_dir(ckpt)
    got = {(p.file, p.reason) for p in problems}
    assert got == {
        ("a", "wrong size"),
        ("b", "SHA-256 mismatch"),
        ("c", "missing"),
        ("stray", "not listed in the manifest"),
    }
    wrong_size = next(p for p in problems if p.file == "a")
    assert (wrong_size.expected, wrong_size.actual) == ("10 bytes", "9 bytes")
    assert "expected" in str(next(p for p in problems if p.file == "b"))


def test_missing_or_malformed_manifest(tmp_path: Path) -> None:
    assert [p.file for p in verify_dir(tmp_path)[1]] == ["manifest.json"]
    (tmp_path / "manifest.json").write_text("{not json")
    assert "malformed" in verify_dir(tmp_path)[1][0].reason
    # A number out of range, nesting too deep: OverflowError and RecursionError crashed resume.
    ckpt = _checkpoint(tmp_path / "c", {"a": b"a"})
    body = json.loads((ckpt / "manifest.json").read_text())
    (ckpt / "manifest.json").write_text(json.dumps(body).replace('"step": 3', '"step": 1e999'))
    assert "OverflowError" in verify_dir(ckpt)[1][0].reason
    (ckpt / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    assert "malformed" in verify_dir(ckpt)[1][0].reason


# A NUL or a lone surrogate made stat() raise ValueError: resume crashed instead of falling back.
@pytest.mark.parametrize("name", ["../outside", "/etc/passwd", "a/../../b", "x\x00y", "x\ud800y"])
def test_manifest_cannot_name_files_outside_the_checkpoint(tmp_path: Path, name: str) -> None:
    ckpt = _checkpoint(tmp_path, {"a": b"a"})
    body = json.loads((ckpt / "manifest.json").read_text())
    body["files"][name] = {"sha256": "0" * 64, "size": 1}
    (ckpt / "manifest.json").write_text(json.dumps(body))
    _, problems = verify_dir(ckpt)
    assert problems[0].file == "manifest.json" and "unsafe file name" in problems[0].reason


def test_a_listed_file_replaced_by_a_link_fails(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "c", {"a": b"a"})
    (tmp_path / "elsewhere").write_bytes(b"a")
    (ckpt / "a").unlink()
    (ckpt / "a").symlink_to(tmp_path / "elsewhere")
    assert verify_dir(ckpt)[1][0].reason == "is a symbolic link"


def test_step_names() -> None:
    assert step_dir_name(40) == "step-00000040"
    assert parse_step("step-00000040") == 40
    assert parse_step(".tmp-step-00000040-abc") is None and parse_step("step-40") is None


@pytest.mark.parametrize(
    ("steps", "keep_last", "keep_every", "protected", "kept"),
    [
        ([1, 2, 3, 4, 5], 2, 0, set(), {4, 5}),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], 2, 4, set(), {4, 8, 9}),
        ([10, 20, 30], 1, 0, {10}, {10, 30}),
        ([10, 20, 30], 5, 0, set(), {10, 20, 30}),
        ([3], 1, 0, {99}, {3}),
    ],
)
def test_retained_steps(
    steps: list[int], keep_last: int, keep_every: int, protected: set[int], kept: set[int]
) -> None:
    assert retained_steps(steps, keep_last, keep_every, protected) == kept


def test_durable_schedule() -> None:
    assert DurableSchedule(0, 0.0).due(7)
    by_step = DurableSchedule(every_steps=10, every_s=0.0)
    assert by_step.due(20) and not by_step.due(25) and by_step.due(25, force=True)
    by_time = DurableSchedule(every_steps=0, every_s=3600.0)
    assert not by_time.due(1)
    by_time.last_copy -= 3601
    assert by_time.due(1)


def test_checkpoint_config_keys_and_async_alias() -> None:
    cfg = load_config(
        "tiny",
        [
            "checkpoint.async=true",
            "checkpoint.every_steps=20",
            "checkpoint.durable_dir=/shared/ck",
            "fault.hang_timeout_s=60",
        ],
    )
    assert cfg.checkpoint.async_save is True and cfg.checkpoint.every_steps == 20
    assert cfg.checkpoint.durable_dir == "/shared/ck" and cfg.fault.hang_timeout_s == 60
    assert cfg.to_dict()["checkpoint"]["async"] is True  # YAML spelling in config.yaml
    assert load_config("tiny", ["checkpoint.async_save=true"]).checkpoint.async_save is True
    with pytest.raises(ConfigError, match=r"unknown config key 'checkpoint\.asink'.*async"):
        load_config("tiny", ["checkpoint.asink=true"])
    with pytest.raises(ConfigError, match=r"checkpoint\.resume"):
        load_config("tiny", ["checkpoint.resume=sometimes"])


def test_public_api_is_pinned() -> None:
    from hpcpipe import checkpoint

    assert sorted(checkpoint.__all__) == [
        "CheckpointError",
        "CheckpointStore",
        "EventFn",
        "Manifest",
        "Problem",
        "RestoreInfo",
        "capture_rng_state",
        "read_manifest",
        "restore_rng_state",
        "verify_dir",
    ]
    for name in checkpoint.__all__:
        assert getattr(checkpoint, name) is not None
    with pytest.raises(AttributeError):
        _ = checkpoint.NoSuchThing  # type: ignore[attr-defined]


def test_a_manifest_without_a_hash_field_is_sha256(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, {"a.distcp": b"x" * 10})
    body = json.loads((ckpt / "manifest.json").read_text())
    assert body.pop("hash") == "sha256" and body["files"]["a.distcp"]["sha256"]
    (ckpt / "manifest.json").write_text(json.dumps(body))  # as written before checkpoint.hash existed
    manifest, problems = verify_dir(ckpt)
    assert problems == [] and manifest is not None and manifest.hash == "sha256"
    body["hash"] = "md5"
    (ckpt / "manifest.json").write_text(json.dumps(body))
    _, problems = verify_dir(ckpt)
    assert [p.reason for p in problems] == ["malformed manifest (unknown hash 'md5')"]
