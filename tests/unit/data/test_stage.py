"""Node-local staging: one verified copy per node, refusals for bad sources, GC that spares use."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import run_cli

from hpcpipe.config import DataConfig
from hpcpipe.data.stage import (
    MARKER,
    StageSource,
    collect_garbage,
    stage,
    stage_for_reading,
    token_dataset_source,
)
from hpcpipe.data.tokens.shards import open_dataset, prepare_dataset
from hpcpipe.errors import DataError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def dataset_dir(tiny_corpus: Path, tmp_path: Path) -> Path:
    cfg = DataConfig(
        sources=[str(tiny_corpus)],
        prepared_dir=str(tmp_path / "prepared"),
        tokenizer="bytes",
        shard_tokens=4096,
        val_fraction=0.1,
    )
    return prepare_dataset(cfg).path


def _stage_in_process(args: tuple[str, str]) -> dict[str, Any]:
    source, cache = args
    staged = stage(token_dataset_source(Path(source)), Path(cache))
    files = sorted(p.name for p in staged.path.iterdir())
    staged.release()
    return {"path": str(staged.path), "copied": staged.copied, "files": files}


def test_four_processes_staging_at_once_leave_one_verified_copy(dataset_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with mp.get_context("spawn").Pool(4) as pool:
        results = pool.map(_stage_in_process, [(str(dataset_dir), str(cache))] * 4)
    assert sum(r["copied"] for r in results) == 1  # one copied, three found it verified
    assert len({r["path"] for r in results}) == 1
    entries = [p for p in cache.iterdir() if p.is_dir()]
    assert len(entries) == 1 and not list(cache.glob(".*tmp*"))
    staged = open_dataset(entries[0])
    assert staged.manifest == open_dataset(dataset_dir).manifest
    assert (entries[0] / MARKER).is_file()
    # Every file's bytes equal the source's.
    for rel in token_dataset_source(dataset_dir).files:
        assert (entries[0] / rel).read_bytes() == (dataset_dir / rel).read_bytes()


def test_a_corrupt_source_is_refused_and_nothing_is_left(dataset_dir: Path, tmp_path: Path) -> None:
    shard = next(dataset_dir.glob("train-*.bin"))
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=shard.name):
        stage(token_dataset_source(dataset_dir), cache)
    assert [p for p in cache.iterdir() if p.is_dir()] == []


def test_a_corrupt_cache_entry_is_staged_again(dataset_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = stage(token_dataset_source(dataset_dir), cache)
    first.release()
    shard = next(first.path.glob("train-*.bin"))
    shard.write_bytes(b"garbage")
    again = stage(token_dataset_source(dataset_dir), cache)
    again.release()
    assert again.copied
    assert shard.read_bytes() == (dataset_dir / shard.name).read_bytes()
    # A third call finds the copy verified and copies nothing.
    third = stage(token_dataset_source(dataset_dir), cache)
    third.release()
    assert not third.copied


def test_a_damaged_entry_is_never_missing_while_it_is_replaced(
    dataset_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was removed in place before the new copy was renamed in: a job reading the entry (an
    image per sample) found no file for as long as the removal took."""
    from hpcpipe.data import stage as staging

    cache = tmp_path / "cache"
    first = stage(token_dataset_source(dataset_dir), cache)
    first.release()
    shard = next(first.path.glob("train-*.bin"))
    shard.write_bytes(b"garbage")
    seen: list[bytes] = []
    remove = staging.shutil.rmtree

    def removing(path: Path, *args: Any, **kwargs: Any) -> None:
        seen.append(shard.read_bytes())  # what a reader would open at this moment
        remove(path, *args, **kwargs)

    monkeypatch.setattr(staging.shutil, "rmtree", removing)
    again = stage(token_dataset_source(dataset_dir), cache)
    again.release()
    assert again.copied and seen and set(seen) == {(dataset_dir / shard.name).read_bytes()}
    assert not list(cache.glob(".*tmp*"))


def test_a_cache_too_small_for_the_dataset_is_named_before_copying(
    dataset_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcpipe.data import stage as staging

    cache = tmp_path / "cache"
    full = staging.shutil.disk_usage(tmp_path)._replace(free=1000)
    monkeypatch.setattr(staging.shutil, "disk_usage", lambda path: full)
    with pytest.raises(
        DataError, match=rf"^{cache}: staging {dataset_dir} needs [\d.,]+ MB, 0\.0 MB are free"
    ):
        stage(token_dataset_source(dataset_dir), cache)
    assert [p.name for p in cache.iterdir() if p.is_dir() or ".tmp-" in p.name] == []


def test_a_disk_filling_up_mid_copy_is_one_error_naming_the_cache(
    dataset_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC names no file: it went out as a traceback (exit 1); the partial copy is removed."""
    from hpcpipe.data import stage as staging

    copy = staging._copy_one
    calls: list[str] = []

    def filling_up(root: Path, dest_root: Path, rel: str, *args: Any) -> None:
        calls.append(rel)
        if len(calls) > 2:
            raise OSError(28, "No space left on device")
        copy(root, dest_root, rel, *args)

    monkeypatch.setattr(staging, "_copy_one", filling_up)
    cache = tmp_path / "cache"
    with pytest.raises(
        DataError, match=rf"^{cache}: staging {dataset_dir} there failed \(No space left on device\)$"
    ):
        stage(token_dataset_source(dataset_dir), cache, workers=1)
    assert [p.name for p in cache.iterdir() if p.is_dir() or ".tmp-" in p.name] == []


class _Signalled(BaseException):
    """What a signal handler raises in the main thread (``data stage``'s exit on SIGTERM)."""


@pytest.mark.parametrize("workers", [1, 4])
def test_a_signal_mid_copy_stops_the_copies_and_removes_the_partial_copy(
    dataset_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """The handler's exception could land while the thread pool started a worker, which was then
    never joined: it copied every file after the partial copy was removed, leaving it behind."""
    import signal

    from hpcpipe.data import stage as staging

    copy = staging._copy_one
    calls: list[str] = []

    def signalled_at_once(root: Path, dest_root: Path, rel: str, *args: Any) -> None:
        calls.append(rel)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGUSR2)
        copy(root, dest_root, rel, *args)

    def handler(_signum: int, _frame: object) -> None:
        raise _Signalled

    monkeypatch.setattr(staging, "_copy_one", signalled_at_once)
    source = token_dataset_source(dataset_dir)
    previous = signal.signal(signal.SIGUSR2, handler)
    try:
        with pytest.raises(_Signalled):
            stage(source, tmp_path / "cache", workers=workers)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == []
    assert len(calls) < len(source.files) > 10  # the threads stopped after their file in progress


def test_a_second_signal_while_joining_still_waits_for_every_copy(
    dataset_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm's --signal=USR1@N, then the preemption's SIGTERM: the second raised out of the join
    of the first, the caller removed the temporary copy, and the threads still copying recreated
    it (mkdir parents) and wrote into it."""
    import signal

    from hpcpipe.data import stage as staging

    copy = staging._copy_one
    calls: list[str] = []
    ended: list[str] = []

    def signalled_twice(root: Path, dest_root: Path, rel: str, *args: Any) -> None:
        calls.append(rel)
        try:
            if len(calls) == 1:
                os.kill(os.getpid(), signal.SIGUSR2)
                time.sleep(0.2)  # the main thread is waiting for this thread by now
                os.kill(os.getpid(), signal.SIGUSR2)
                time.sleep(0.2)
            copy(root, dest_root, rel, *args)
        finally:
            ended.append(rel)

    signals: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        signals.append(signum)
        raise _Signalled(len(signals))

    monkeypatch.setattr(staging, "_copy_one", signalled_twice)
    previous = signal.signal(signal.SIGUSR2, handler)
    try:
        with pytest.raises(_Signalled) as raised:
            stage(token_dataset_source(dataset_dir), tmp_path / "cache", workers=1)
        copying_on = len(calls) - len(ended)
        time.sleep(0.5)  # what a copy still running would write by now
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert raised.value.args == (1,) and len(signals) == 2  # the first signal's, after both
    assert copying_on == 0
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == []


def test_a_stopped_copy_ends_at_its_next_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-GB shard copied to its end held a preempted stager's exit past the grace period."""
    import hashlib
    import threading

    from hpcpipe.data import stage as staging

    monkeypatch.setattr(staging, "_CHUNK", 1024)
    (tmp_path / "big.bin").write_bytes(os.urandom(64 * 1024))
    want = hashlib.sha256((tmp_path / "big.bin").read_bytes()).hexdigest()
    stop = threading.Event()
    stop.set()
    with pytest.raises(DataError, match=r"big.bin: copy abandoned \(staging stopped\)$"):
        staging._copy_one(tmp_path, tmp_path / "dest", "big.bin", want, stop)
    assert (tmp_path / "dest" / "big.bin").stat().st_size < 64 * 1024


def _left_by_a_killed_stager(cache: Path, key: str, pid: int) -> Path:
    partial = cache / f".{key}.tmp-{pid}"
    (partial / "sub").mkdir(parents=True)
    (partial / "sub" / "half-copied.bin").write_bytes(b"x" * 4096)
    return partial


def test_a_killed_stagers_copy_is_removed_by_the_next_stage(dataset_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    source = token_dataset_source(dataset_dir)
    cache.mkdir()
    partial = [_left_by_a_killed_stager(cache, source.key, pid) for pid in (11, 12)]
    other_key = _left_by_a_killed_stager(cache, "b" * 64, 13)
    staged = stage(source, cache)
    staged.release()
    assert staged.copied and not any(p.exists() for p in partial)
    assert other_key.is_dir()  # another dataset's: its own stager or collect_garbage decides


def test_gc_removes_partial_copies_but_not_one_being_copied(dataset_dir: Path, tmp_path: Path) -> None:
    import fcntl

    cache = tmp_path / "cache"
    cache.mkdir()
    orphan = _left_by_a_killed_stager(cache, "b" * 64, 13)
    in_progress = _left_by_a_killed_stager(cache, "c" * 64, 14)
    with (cache / f"{'c' * 64}.lock").open("ab") as copying:
        fcntl.flock(copying, fcntl.LOCK_EX)  # its copier is alive
        assert collect_garbage(cache, days=7) == []
        assert not orphan.exists() and in_progress.is_dir()
    collect_garbage(cache, days=7)
    assert not in_progress.exists()


def test_a_missing_marker_means_not_staged(dataset_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = stage(token_dataset_source(dataset_dir), cache)
    first.release()
    (first.path / MARKER).unlink()
    again = stage(token_dataset_source(dataset_dir), cache)
    again.release()
    assert again.copied and (again.path / MARKER).is_file()


def test_gc_removes_old_entries_but_never_one_in_use(dataset_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    source = token_dataset_source(dataset_dir)
    in_use = stage(source, cache)  # holds its shared lock: in use
    old = cache / ("a" * 64)
    old.mkdir()
    (old / MARKER).write_text("{}")
    long_ago = time.time() - 30 * 86400
    for path in (old / MARKER, in_use.path / MARKER):
        os.utime(path, (long_ago, long_ago))
    assert collect_garbage(cache, days=7) == ["a" * 64]
    assert in_use.path.is_dir()
    in_use.release()
    # Released and old: now it goes, unless the caller keeps it.
    assert collect_garbage(cache, days=7, keep=frozenset({source.key})) == []
    assert collect_garbage(cache, days=7) == [source.key]


@pytest.mark.parametrize("name", ["../escape.bin", "/etc/passwd", "a/../../b", ""])
def test_manifest_names_that_leave_the_dataset_are_refused(tmp_path: Path, name: str) -> None:
    source = StageSource(root=tmp_path, files={name: "0" * 64}, key="1" * 64)
    with pytest.raises(DataError, match="not a path inside the dataset"):
        stage(source, tmp_path / "cache")
    assert not (tmp_path / "escape.bin").exists()


def test_a_key_that_is_not_a_hash_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a SHA-256"):
        stage(StageSource(root=tmp_path, files={}, key="../../etc"), tmp_path / "cache")


def test_a_symlink_out_of_the_source_is_refused(dataset_dir: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not data")
    source = token_dataset_source(dataset_dir)
    link = dataset_dir / "link.bin"
    link.symlink_to(secret)
    bad = StageSource(source.root, {**source.files, "link.bin": "0" * 64}, source.key)
    with pytest.raises(DataError, match="leads outside"):
        stage(bad, tmp_path / "cache")


def test_the_gpt_recipe_reads_the_staged_copy(dataset_dir: Path, tiny_corpus: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = stage_for_reading(token_dataset_source(dataset_dir), cache, verify="full")
    assert path.parent == cache
    # A later reader on the node checks sizes only, and reuses it.
    assert stage_for_reading(token_dataset_source(dataset_dir), cache) == path


def test_stage_cli_copies_then_reuses_and_names_a_bad_source(dataset_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = run_cli("data", "stage", str(dataset_dir), str(cache), "--json", "-")
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert result["copied"] and Path(result["path"]).parent == cache
    second = json.loads(run_cli("data", "stage", str(dataset_dir), str(cache), "--json", "-").stdout)
    assert not second["copied"]
    missing = run_cli("data", "stage", str(tmp_path / "nope"), str(cache))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "nope" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    alone = run_cli("data", "stage", str(dataset_dir))
    assert alone.returncode == 2 and "CACHE_ROOT" in alone.stderr
