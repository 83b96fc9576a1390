"""Node-local staging throughput: ``hpcpipe data stage`` against ``cp`` of the same files.

A synthetic prepared dataset (``--files`` shards of ``--mb`` MB each, random bytes, with a
manifest of their SHA-256) is copied to a fresh cache directory, alternating, ``--repeats``
times each:

- hpcpipe: ``stage()`` (the ``hpcpipe data stage`` path): 4 threads copy and hash each file in one
  pass, fsync each file, compare every hash with the manifest, write the marker, rename;
- cp: ``cp -r`` of the same directory, then ``sync`` (cp alone does not make the copy durable,
  staging does; both columns are printed).

The source stays in the page cache (same for both), so this measures the copy and hashing, not
the shared file system's read speed. Medians and the ratio hpcpipe / (cp + sync); > 1 is slower.

    .venv/bin/python benchmarks/stage_copy.py --files 8 --mb 64 --repeats 5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import emit, measure_round, parse_with_smoke  # noqa: E402
from hpcpipe.data.stage import StageSource, stage  # noqa: E402


def _make_dataset(root: Path, files: int, mb: int) -> StageSource:
    root.mkdir(parents=True)
    digests = {}
    for i in range(files):
        data = os.urandom(mb << 20)
        name = f"train-{i:05d}.bin"
        (root / name).write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    manifest = json.dumps(digests, sort_keys=True).encode()
    (root / "manifest.json").write_bytes(manifest)
    digests["manifest.json"] = hashlib.sha256(manifest).hexdigest()
    os.sync()  # the source on disk now: the cp arm's global `sync` wrote it back in its first round
    return StageSource(root=root, files=digests, key=digests["manifest.json"])


def _time_stage(source: StageSource, cache: Path) -> float:
    started = time.perf_counter()
    staged = stage(source, cache)
    elapsed = time.perf_counter() - started
    staged.release()
    assert staged.copied
    return elapsed


def _time_cp(source: Path, dest: Path, copy_only: list[float]) -> float:
    """Seconds of ``cp -r`` and ``sync``; the copy's own seconds appended to ``copy_only``."""
    started = time.perf_counter()
    subprocess.run(["cp", "-r", str(source), str(dest)], check=True)
    copy_only.append(time.perf_counter() - started)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mb", type=int, default=64, help="MB per file")
    parser.add_argument("--repeats", type=int, default=5)
    args = parse_with_smoke(parser, {"files": 2, "mb": 1, "repeats": 1})
    with tempfile.TemporaryDirectory(prefix="stage-bench-", dir=ROOT) as tmp:
        work = Path(tmp)
        source = _make_dataset(work / "source", args.files, args.mb)
        total_mb = sum((source.root / rel).stat().st_size for rel in source.files) / 1e6
        times: dict[str, list[float]] = {"hpcpipe": [], "cp": [], "cp_sync": []}
        for i in range(args.repeats):
            arms = {
                "hpcpipe": partial(_time_stage, source, work / f"cache-{i}"),
                "cp_sync": partial(_time_cp, source.root, work / f"cp-{i}", times["cp"]),
            }
            measure_round(arms, i, times)
            shutil.rmtree(work / f"cache-{i}")
            shutil.rmtree(work / f"cp-{i}")
    medians = {k: statistics.median(v) for k, v in times.items()}
    ratio = medians["hpcpipe"] / medians["cp_sync"]
    print(f"staging {total_mb:.0f} MB in {args.files} files, median of {args.repeats}:")
    for name, seconds in medians.items():
        print(f"  {name:8s} {seconds:7.3f} s  {total_mb / seconds:8.0f} MB/s")
    alone = medians["hpcpipe"] / medians["cp"]
    print(f"ratio hpcpipe / (cp + sync): {ratio:.2f}  (hpcpipe / cp alone: {alone:.2f})")
    result = {
        "benchmark": "stage_copy",
        "megabytes": round(total_mb, 1),
        "files": args.files,
        "repeats": args.repeats,
        "median_s": {k: round(v, 4) for k, v in medians.items()},
        "mb_per_s": {k: round(total_mb / v, 1) for k, v in medians.items()},
        "ratio_vs_cp_sync": round(ratio, 3),
        "ratio_vs_cp": round(alone, 3),
    }
    emit(result)


if __name__ == "__main__":
    main()
