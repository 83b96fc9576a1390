"""Steps of ``gpu_suite.py`` that run in a Python process of their own rather than through the CLI.

    python benchmarks/gpu_suite_steps.py checkpoint --device cuda --layers 4 --d-model 1024 --json ckpt.json

``checkpoint``: a GPT from ``hpcpipe.models.gpt`` and its AdamW moments (one step taken), held on
``--device``, saved with ``CheckpointStore.save`` (sync: DCP shards, fsync, hashes, manifest,
commit) and restored with ``CheckpointStore.restore`` (verify while reading, tensors landed back
on the device), against the raw way of moving the same bytes: every tensor copied to the host,
written in one file and fsynced; read back and copied to the device. Reads start from a cold page
cache (``posix_fadvise(DONTNEED)``). Each repeat runs both arms of save then of restore, in
rotated order (``harness.measure_round``). Before every restore the model and optimizer state
are overwritten with zeros; after the last one every tensor must equal what was saved, bit for
bit. Ratios are raw time / hpcpipe time (>= 1: hpcpipe as fast as raw). On a GPU the raw arm
includes the device-to-host and host-to-device copies, as the store's own path does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from checkpoint_io import evict  # the same cold-cache read as checkpoint_io's
from harness import measure_round

CHUNK = 8 << 20


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every tensor a checkpoint holds: parameters, buffers and the optimizer's state."""
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    for index, state in enumerate(optimizer.state.values()):
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{index}.{key}"] = value
    return tensors


class CheckpointBench:
    def __init__(
        self, root: Path, device: torch.device, layers: int, d_model: int, vocab: int, hash_name: str
    ) -> None:
        from hpcpipe.config import CheckpointConfig, ModelConfig
        from hpcpipe.models.gpt import GPT

        torch.manual_seed(0)
        self.device = device
        self.root = root
        cfg = ModelConfig(n_layers=layers, d_model=d_model, n_heads=8, seq_len=256)
        self.model = GPT(cfg, vocab).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.model(torch.zeros(1, 8, dtype=torch.long, device=device)).sum().backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.tensors = state_tensors(self.model, self.optimizer)
        self.saved = {k: v.detach().clone() for k, v in self.tensors.items()}
        self.nbytes = sum(t.numel() * t.element_size() for t in self.tensors.values())
        self.cfg = CheckpointConfig(keep_last=1, memory_tier=False, hash=hash_name)
        self.raw = root / "raw.bin"
        self.step = 0

    def store(self) -> Any:
        from hpcpipe.checkpoint import CheckpointStore

        return CheckpointStore(self.cfg, self.root / "store")

    def save(self) -> float:
        self.step += 1
        store = self.store()
        synchronize(self.device)
        start = time.perf_counter()
        store.save(self.step, self.model, self.optimizer, {"step": self.step})
        seconds = time.perf_counter() - start
        store.close()  # verification and retention after the commit: not part of the save
        return seconds

    def raw_write(self) -> float:
        synchronize(self.device)
        start = time.perf_counter()
        with self.raw.open("wb") as handle:
            for tensor in self.tensors.values():
                host = tensor.detach().contiguous().view(-1).view(torch.uint8).cpu()
                view = host.numpy().data
                for offset in range(0, len(view), CHUNK):
                    handle.write(view[offset : offset + CHUNK])
            handle.flush()
            os.fsync(handle.fileno())
        return time.perf_counter() - start

    def clobber(self) -> None:
        with torch.no_grad():
            for tensor in self.tensors.values():
                tensor.zero_()
        synchronize(self.device)

    def restore(self) -> float:
        newest = sorted((self.root / "store").glob("step-*"))[-1]
        evict([p for p in newest.rglob("*") if p.is_file()])
        self.clobber()
        store = self.store()
        start = time.perf_counter()
        store.restore(self.model, self.optimizer)
        synchronize(self.device)
        seconds = time.perf_counter() - start
        self.tensors = state_tensors(self.model, self.optimizer)  # the load may have put new ones
        return seconds

    def raw_read(self) -> float:
        evict([self.raw])
        self.clobber()
        start = time.perf_counter()
        data = bytearray(self.raw.stat().st_size)
        with self.raw.open("rb", buffering=0) as handle:
            view = memoryview(data)
            offset = 0
            while offset < len(view):
                got = handle.readinto(view[offset : offset + CHUNK])
                if not got:
                    break
                offset += got
        host = torch.frombuffer(data, dtype=torch.uint8)
        offset = 0
        with torch.no_grad():
            for tensor in self.tensors.values():
                size = tensor.numel() * tensor.element_size()
                tensor.view(-1).view(torch.uint8).copy_(host[offset : offset + size], non_blocking=True)
                offset += size
        synchronize(self.device)
        return time.perf_counter() - start

    def differing(self) -> list[str]:
        # restore() may land new tensors in the optimizer state: compare what the objects hold now
        now = state_tensors(self.model, self.optimizer)
        return [k for k, v in self.saved.items() if k not in now or not torch.equal(now[k].to(v.device), v)]


def checkpoint(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    root = Path(args.dir) / "checkpoint-scratch"
    root.mkdir(parents=True, exist_ok=True)
    bench = CheckpointBench(root, device, args.layers, args.d_model, args.vocab, args.hash)
    bench.save(), bench.raw_write()  # warm-up: first-call costs (DCP planning, the file's blocks)
    times: dict[str, list[float]] = {}
    writes: dict[str, Callable[[], float]] = {"save": bench.save, "raw_write": bench.raw_write}
    reads: dict[str, Callable[[], float]] = {"restore": bench.restore, "raw_read": bench.raw_read}
    for repeat in range(args.repeats):
        measure_round(writes, repeat, times)
        measure_round(reads, repeat, times)
    bench.restore()  # the last word is the store's: what it restored is checked
    differing = bench.differing()
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "bytes": bench.nbytes,
        "tensors": len(bench.tensors),
        "repeats": args.repeats,
        "hash": args.hash,
        "median_s": med,
        "seconds": times,
        "ratios": {
            "save_vs_raw_write": med["raw_write"] / med["save"],
            "restore_vs_raw_read": med["raw_read"] / med["restore"],
        },
        "restored_equal": not differing,
        "differing": differing,
    }
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    shutil.rmtree(root, ignore_errors=True)  # on a GPU, a few GB of checkpoints and raw copies
    mb = bench.nbytes / 1e6
    for key in ("save", "raw_write", "restore", "raw_read"):
        print(f"{key:<10} {med[key]:8.3f} s  {mb / med[key]:8.0f} MB/s")
    print(f"restored tensors equal the saved ones: {not differing}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="step", required=True)
    ckpt = sub.add_parser("checkpoint", help="CheckpointStore save/restore of device tensors vs raw I/O")
    ckpt.add_argument("--device", default="cuda", help="where the model and optimizer state live")
    ckpt.add_argument("--dir", default=".", help="parent of the scratch directory (the disk under test)")
    ckpt.add_argument("--json", required=True, help="write the figures here")
    ckpt.add_argument("--layers", type=int, default=4)
    ckpt.add_argument("--d-model", type=int, default=1024)
    ckpt.add_argument("--vocab", type=int, default=4096)
    ckpt.add_argument("--repeats", type=int, default=3)
    ckpt.add_argument("--hash", choices=["blake3", "sha256"], default="blake3", help="checkpoint.hash")
    args = parser.parse_args()
    checkpoint(args)


if __name__ == "__main__":
    main()
