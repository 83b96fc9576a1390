"""Slurm launch overhead and cross-node bandwidth on the test cluster (two slurmd in network
namespaces on this machine; needs root and Debian's slurm-wlm + munge).

1. Seconds from submitting to the first training step (the first metrics row), 2 nodes x 2
   processes of the ``tiny`` preset:
   - hpcpipe: ``hpcpipe launch slurm tiny --nodes 2`` (its rendered script: prepare, the
     checkpoint probe, one hpcpipe agent per node);
   - raw: ``sbatch`` of a hand-written script that runs ``torchrun`` on each node through
     ``srun`` with the same c10d rendezvous and the same worker module.
   Alternating, ``--repeats`` times each; the median of each and their ratio.
2. all_reduce busbw of ``bench collectives`` across the two namespaces (srun -N2, gloo over the
   veth pair and bridge) vs the same 2 ranks on one host (loopback).

    sudo .venv/bin/python benchmarks/slurm_launch.py --repeats 3

``--smoke`` stops before submitting (no cluster, no root: the test cluster's bridge and subnet are
fixed, so it cannot start beside the integration tests' own): both job scripts rendered as the
timed runs render them, and each checked by ``bash -n``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.slurm_cluster import SlurmCluster, job_overrides, missing_capability  # noqa: E402

from harness import emit, measure_round, parse_with_smoke  # noqa: E402
from hpcpipe.config import load_config  # noqa: E402

RAW_SCRIPT = """#!/bin/bash
#SBATCH --job-name=raw
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output={out}/slurm-%j.out
export GLOO_SOCKET_IFNAME=eth0
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# Node names are not the kernel hostname here (namespaces), so each node says whether it hosts
# the c10d store; on a cluster where they match, torchrun works that out itself.
srun --kill-on-bad-exit=1 bash -c '{python} -m torch.distributed.run --nnodes 2 --nproc-per-node 2 \\
  --rdzv-backend c10d --rdzv-endpoint '"$head_node"':29611 --rdzv-id '"$SLURM_JOB_ID"' \\
  --local-addr "$SLURMD_NODENAME" \\
  --rdzv-conf is_host=$([ "$SLURMD_NODENAME" = '"$head_node"' ] && echo true || echo false) \\
  -m hpcpipe.launch.worker {config}'
"""


def _sets(work: Path, name: str) -> list[str]:
    return [
        *job_overrides(work, name),
        "observe.log_every=1",
        "parallel.nproc=2",
        "train.global_batch_size=16",
        "train.steps=30",
    ]


def _first_step_s(run_dir: Path, started: float, timeout_s: float = 300) -> float:
    metrics = run_dir / "metrics.jsonl"
    while time.perf_counter() - started < timeout_s:
        if metrics.is_file() and '"loss"' in metrics.read_text():
            return time.perf_counter() - started
        time.sleep(0.05)
    raise TimeoutError(f"{run_dir}: no training step after {timeout_s} s")


def _launch(work: Path, name: str) -> list[str]:
    """``hpcpipe launch slurm`` of the hpcpipe arm."""
    args = [a for s in _sets(work, name) for a in ("--set", s)]
    return [sys.executable, "-m", "hpcpipe", "launch", "slurm", "tiny", "--nodes", "2", *args]


def _hpcpipe(cluster: SlurmCluster, work: Path, index: int) -> float:
    name = f"hpcpipe-{index}"
    started = time.perf_counter()
    subprocess.run(_launch(work, name), env=cluster.env, cwd=work, check=True, capture_output=True)
    seconds = _first_step_s(work / "runs" / name, started)
    _drain(cluster)
    return seconds


def _raw_script(work: Path, name: str) -> Path:
    """The hand-written sbatch script of the raw arm, with its job's config beside it."""
    job = load_config("tiny", _sets(work, name))
    job.run_dir.mkdir(parents=True, exist_ok=True)
    config = job.run_dir / "config.yaml"
    config.write_text(job.to_yaml())
    script = job.run_dir / "raw.sbatch"
    script.write_text(RAW_SCRIPT.format(out=job.run_dir, python=sys.executable, config=config))
    return script


def _raw(cluster: SlurmCluster, work: Path, index: int) -> float:
    script = _raw_script(work, f"raw-{index}")
    started = time.perf_counter()
    subprocess.run(["sbatch", "--parsable", str(script)], env=cluster.env, check=True, capture_output=True)
    seconds = _first_step_s(script.parent, started)
    _drain(cluster)
    return seconds


def _drain(cluster: SlurmCluster) -> None:
    """Wait until no job is queued or running, so runs do not overlap."""
    while cluster.run("squeue", "--noheader").stdout.strip():
        time.sleep(0.5)


def _busbw(argv: list[str], env: dict[str, str]) -> float:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=300)
    return float(json.loads(proc.stdout)["results"][-1]["busbw_gbps"])


def _first_steps(cluster: SlurmCluster, work: Path, repeats: int) -> tuple[list[float], list[float]]:
    prepare = [sys.executable, "-m", "hpcpipe", "data", "prepare", "tiny"]
    subprocess.run([*prepare, "--set", f"data.prepared_dir={work / 'prepared'}"], check=True, cwd=work)
    times: dict[str, list[float]] = {"hpcpipe": [], "raw": []}
    for index in range(repeats):  # rotated, so drift hits both alike
        arms = {
            "hpcpipe": partial(_hpcpipe, cluster, work, index),
            "raw": partial(_raw, cluster, work, index),
        }
        measure_round(arms, index, times)
        print(
            f"round {index + 1}: hpcpipe {times['hpcpipe'][-1]:.1f} s, raw {times['raw'][-1]:.1f} s",
            flush=True,
        )
    return times["hpcpipe"], times["raw"]


def _busbw_pair(cluster: SlurmCluster) -> tuple[float, float]:
    bench = [sys.executable, "-m", "hpcpipe", "bench", "collectives", "-c", "all_reduce"]
    bench += ["--sizes", "16M", "--iters", "10", "--json", "-"]
    srun = ["srun", "-N2", "--ntasks-per-node=1", "--export=ALL,GLOO_SOCKET_IFNAME=eth0"]
    return _busbw([*srun, *bench], cluster.env), _busbw([*bench, "--nproc", "2"], cluster.env)


def smoke() -> None:
    """Everything up to ``sbatch``: hpcpipe's script (``--dry-run``) and the raw one, for the
    same jobs as round 1, each parsed by ``bash -n``."""
    with tempfile.TemporaryDirectory(prefix="hpcpipe-slurm-bench-") as tmp:
        work = Path(tmp)
        ours = work / "hpcpipe.sbatch"
        rendered = subprocess.run(
            [*_launch(work, "hpcpipe-0"), "--dry-run"], cwd=work, check=True, capture_output=True, text=True
        )
        ours.write_text(rendered.stdout)
        scripts = {"hpcpipe": ours, "raw": _raw_script(work, "raw-0")}
        lines = {}
        for arm, script in scripts.items():
            subprocess.run(["bash", "-n", str(script)], check=True)
            lines[arm] = len(script.read_text().splitlines())
            print(f"{arm}: sbatch script of {lines[arm]} lines rendered, bash -n: ok; not submitted")
    emit({"benchmark": "slurm_launch", "submitted": False, "script_lines": lines})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_with_smoke(parser, {"repeats": 1})
    if args.smoke:
        smoke()
        return
    reason = missing_capability()
    if reason:
        sys.exit(f"cannot start the test cluster: {reason}")
    with tempfile.TemporaryDirectory(prefix="hpcpipe-slurm-bench-") as tmp:
        cluster = SlurmCluster.create(Path(tmp)).start()
        try:
            work = Path(tmp) / "work"
            work.mkdir()
            hp, raw = _first_steps(cluster, work, args.repeats)
            across, one_host = _busbw_pair(cluster)
        finally:
            cluster.stop()
    hp_s, raw_s = statistics.median(hp), statistics.median(raw)
    result = {
        "benchmark": "slurm_launch",
        "first_step_s_hpcpipe": round(hp_s, 2),
        "first_step_s_raw": round(raw_s, 2),
        "ratio_hpcpipe_over_raw": round(hp_s / raw_s, 3),
        "repeats": args.repeats,
        "busbw_gbps_across_namespaces": round(across, 4),
        "busbw_gbps_one_host": round(one_host, 4),
        "busbw_ratio_across_over_one_host": round(across / one_host, 3),
        "all_reduce_bytes": 16 * 2**20,
    }
    print(f"time to first step: hpcpipe {hp_s:.1f} s, raw {raw_s:.1f} s, ratio {hp_s / raw_s:.3f}")
    print(f"all_reduce 16 MiB busbw: across namespaces {across:.3f} GB/s, one host {one_host:.3f} GB/s")
    emit(result)


if __name__ == "__main__":
    main()
