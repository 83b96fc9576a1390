"""Checkpoint I/O vs raw file I/O of the same bytes, side by side in one run on one directory.

The state is a GPT from ``hpcpipe.models.gpt`` plus its AdamW moments (~100 MB by default).
Each repeat runs, in alternating order so drift on a shared machine hits both sides:

- save: ``CheckpointStore.save`` (sync: DCP shards with fsync, hashes, manifest, atomic
  commit) vs one sequential write of the same number of bytes with fsync (target ratio >= 0.8);
- load: ``CheckpointStore.restore`` (every file read once, hashed as it is read, tensors landed
  in the model and optimizer) vs one sequential read of the same bytes (target >= 0.8). Both
  start from a cold page cache (``posix_fadvise(DONTNEED)`` on every file) so the disk is read,
  not memory;
- memory tier: the same restore when the node's memory tier (``/dev/shm``, owned here as an
  agent would) holds the checkpoint: hashed all the same, but no disk read;
- async: the time ``save`` blocks with ``checkpoint.async`` (staging to CPU) / the sync save
  time (target <= 0.1).

    .venv/bin/python benchmarks/checkpoint_io.py [--repeats 5] [--dir .] [--d-model 512] [--hash blake3]
    .venv/bin/python benchmarks/checkpoint_io.py --layers 4 --d-model 128      # the quickstart's GPT
    .venv/bin/python benchmarks/checkpoint_io.py --layers 4 --d-model 1024     # ~650 MB
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from harness import emit, measure_round, parse_with_smoke
from hpcpipe.checkpoint import CheckpointStore, memory_tier, read_manifest
from hpcpipe.config import CheckpointConfig, ModelConfig
from hpcpipe.models.gpt import GPT

CHUNK = 8 << 20


def build(args: argparse.Namespace) -> tuple[GPT, torch.optim.Optimizer]:
    """A GPT whose AdamW moments exist (one step taken), as a trainer would checkpoint it."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=8, seq_len=256)
    model = GPT(cfg, args.vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def evict(paths: list[Path]) -> None:
    """Drop clean cached pages of these files, so the next read comes from the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_of(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()]


def raw_write(path: Path, payload: bytes) -> float:
    start = time.perf_counter()
    with path.open("wb") as handle:
        view = memoryview(payload)
        for offset in range(0, len(view), CHUNK):
            handle.write(view[offset : offset + CHUNK])
        handle.flush()
        os.fsync(handle.fileno())
    return time.perf_counter() - start


def raw_read(path: Path) -> float:
    evict([path])
    buffer = bytearray(CHUNK)
    start = time.perf_counter()
    with path.open("rb", buffering=0) as handle:
        while handle.readinto(buffer):
            pass
    return time.perf_counter() - start


class Bench:
    """Runs one kind of operation per call on a shared directory; returns seconds."""

    def __init__(self, root: Path, model: GPT, optimizer: torch.optim.Optimizer, hash_name: str) -> None:
        self.root, self.model, self.optimizer = root, model, optimizer
        self.step = 0
        self.cfg = CheckpointConfig(keep_last=1, hash=hash_name)  # type: ignore[arg-type]
        self.async_store = CheckpointStore(self.cfg.model_copy(update={"async_save": True}), root / "async")

    def sync_save(self) -> float:
        self.step += 1
        store = CheckpointStore(self.cfg, self.root / "sync")
        start = time.perf_counter()
        store.save(self.step, self.model, self.optimizer, {"step": self.step})
        seconds = time.perf_counter() - start
        store.close()  # verification + retention after the commit: not part of the save
        return seconds

    def async_block(self) -> float:
        self.step += 1
        start = time.perf_counter()
        self.async_store.save(self.step, self.model, self.optimizer, {"step": self.step})
        seconds = time.perf_counter() - start
        self.async_store.wait()
        return seconds

    def newest(self) -> Path:
        return sorted((self.root / "sync").glob("step-*"))[-1]

    def restore(self) -> float:
        evict(files_of(self.newest()))
        store = CheckpointStore(CheckpointConfig(memory_tier=False), self.root / "sync")
        start = time.perf_counter()
        store.restore(self.model, self.optimizer)
        return time.perf_counter() - start

    def memory_restore(self) -> float:
        """Restore with the newest checkpoint in the memory tier (its copy made by the last save)."""
        store = CheckpointStore(CheckpointConfig(), self.root / "sync")
        assert store.memory is not None and store.memory.step_dir(self.step) is not None
        start = time.perf_counter()
        store.restore(self.model, self.optimizer)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=".", help="parent of the scratch directory (pick the disk to test)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--hash", choices=["blake3", "sha256"], default="blake3", help="checkpoint.hash")
    args = parse_with_smoke(parser, {"repeats": 1, "layers": 1, "d_model": 64, "vocab": 256})

    model, optimizer = build(args)
    keys = ("save", "write", "restore", "memory", "read", "async")
    times: dict[str, list[float]] = {k: [] for k in keys}
    with (
        tempfile.TemporaryDirectory(prefix="hpcpipe-ckpt-bench-", dir=args.dir) as tmp,
        memory_tier.owned(Path(tmp) / "sync", None),  # as the node's agent: the saves copy into it
    ):
        root = Path(tmp)
        bench = Bench(root, model, optimizer, args.hash)
        bench.sync_save(), bench.async_block()  # warm-up: first-call costs, the staging buffer
        nbytes = read_manifest(bench.newest()).total_bytes
        payload = os.urandom(nbytes)
        raw = root / "raw.bin"
        writes: dict[str, Callable[[], float]] = {
            "save": bench.sync_save,
            "write": partial(raw_write, raw, payload),
        }
        reads: dict[str, Callable[[], float]] = {"restore": bench.restore, "read": partial(raw_read, raw)}
        for repeat in range(args.repeats):
            measure_round(writes, repeat, times)
            measure_round(reads, repeat, times)
            # before the async save: the memory tier holds the sync saves' steps, not the next one
            times["memory"].append(bench.memory_restore())
            times["async"].append(bench.async_block())
        bench.async_store.close()
        shutil.rmtree(root / "async", ignore_errors=True)
    report(times, nbytes, args.repeats, args.hash)


def report(times: dict[str, list[float]], nbytes: int, repeats: int, hash_name: str) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    mb = nbytes / 1e6
    print(
        f"state {mb:.1f} MB (GPT + AdamW moments), checkpoint.hash={hash_name}, "
        f"threads={torch.get_num_threads()}, {repeats} repeats, medians, cold page cache for reads"
    )
    print(f"{'operation':<42}{'median s':>10}{'MB/s':>10}{'min s':>9}{'max s':>9}")
    rows = [
        ("save (sync: DCP + fsync + hash + commit)", "save"),
        ("raw sequential write + fsync", "write"),
        (f"restore (read once, {hash_name} while reading)", "restore"),
        ("restore from the memory tier", "memory"),
        ("raw sequential read", "read"),
        ("async save: blocking part", "async"),
    ]
    for label, key in rows:
        xs = times[key]
        print(f"{label:<42}{med[key]:>10.3f}{mb / med[key]:>10.0f}{min(xs):>9.3f}{max(xs):>9.3f}")
    ratios = {
        "save_vs_raw_write": med["write"] / med["save"],
        "restore_vs_raw_read": med["read"] / med["restore"],
        "memory_restore_speedup": med["restore"] / med["memory"],
        "async_block_vs_sync_save": med["async"] / med["save"],
    }
    print(f"save / raw write        = {ratios['save_vs_raw_write']:.3f} (target >= 0.8)")
    print(f"restore / raw read      = {ratios['restore_vs_raw_read']:.3f} (target >= 0.8)")
    print(f"memory-tier restore     = {ratios['memory_restore_speedup']:.2f}x faster than from disk")
    print(f"async blocking / sync   = {ratios['async_block_vs_sync_save']:.3f} (target <= 0.1)")
    emit(
        {
            "benchmark": "checkpoint_io",
            "hash": hash_name,
            "bytes": nbytes,
            "repeats": repeats,
            "median_s": {k: round(v, 4) for k, v in med.items()},
            "ratios": {k: round(v, 4) for k, v in ratios.items()},
            "targets": {
                "save_vs_raw_write": ">=0.8",
                "restore_vs_raw_read": ">=0.8",
                "async_block_vs_sync_save": "<=0.1",
            },
        }
    )


if __name__ == "__main__":
    main()
