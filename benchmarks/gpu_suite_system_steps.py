"""The GPU suite's machine and system steps (``gpu_suite.py``): the data the training steps use
(prepare), ``hpcpipe doctor``, ``hpcpipe bench compute``'s ceilings, the NVML gauges of the
Prometheus exporter scraped while a run trains, CheckpointStore against raw I/O, and the fork
server starting CUDA workers without CUDA in itself."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import time
import urllib.request
from typing import Any

from gpu_suite_proc import Command, children, free_port, maps_libcuda, parse_metrics, process_tree, read_proc
from gpu_suite_run import DRY, HERE, PASS, REPO, Outcome, StepFailed, StepRun, need_packages

CKPT_RATIO_GOAL = 0.8  # benchmarks/README.md: save, restore >= 0.8 of raw


def step_prepare(run: StepRun) -> Outcome:
    suite = run.suite
    run.run(["data", "prepare", "gpt-124m", *run.hpcpipe_sets(suite.gpt_sets())])
    train, test = (4096, 256) if suite.gpu else (32, 8)
    if suite.images.exists():
        shutil.rmtree(suite.images)
    run.run(["data", "make-images", "cifar10", str(suite.images), "--train", str(train), "--test", str(test)])
    return Outcome(PASS, f"gpt-124m tokens, {train} images", data={"prepared_dir": str(suite.prepared)})


DOCTOR_GPU_ROWS = ("cuda", "nccl", "gpus (nvml)")


def step_doctor(run: StepRun) -> Outcome:
    path = run.dir / "doctor.json"
    run.run(["doctor", "--run-dir", str(run.suite.out), "--json", str(path)], ok=(0, 1))
    report = json.loads(path.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    data: dict[str, Any] = {"doctor": report}
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False, timeout=30)
        data["nvidia_smi_L"] = smi.stdout.strip().splitlines()
    failed = [c for c in report["checks"] if c["status"] == "FAIL"]
    if failed:
        raise StepFailed("; ".join(f"{c['name']}: {c['summary']}" for c in failed))
    rows = {name: checks.get(name, {"status": "absent", "summary": ""}) for name in DOCTOR_GPU_ROWS}
    figure = ", ".join(f"{name} {row['status']}" for name, row in rows.items())
    if not run.suite.gpu:
        return Outcome(DRY, figure, "no GPU: the GPU rows cannot say OK here; the other rows ran", data)
    bad = [
        f"{name}: {row['status']} ({row['summary']})"
        for name, row in rows.items()
        if row["status"] not in ("OK", "WARN")
    ]
    if bad:
        raise StepFailed("; ".join(bad))
    return Outcome(PASS, figure, data=data)


def step_compute(run: StepRun) -> Outcome:
    path = run.dir / "compute.json"
    # The dry run's fp32 figure is the peak its MFU figures divide by: bench compute's own n for a
    # CPU (1024; bf16 and fp16 fitted down where emulated) and 3 windows, not a 256 matmul timed
    # once, which ran below what the LoRA step's larger matmuls reach (an MFU of 95-140%).
    sizes = [] if run.suite.gpu else ["--copy-size", "16M", "--min-time", "0.2", "--repeats", "3"]
    run.run(["bench", "compute", "--json", str(path), *sizes])
    result = json.loads(path.read_text())
    figures = result["figures"]
    main = "matmul_bf16" if run.suite.gpu else "matmul_fp32"
    value = figures.get(main, {}).get("value")
    if value is None:
        raise StepFailed(f"{main}: {figures.get(main, {}).get('skipped') or 'not measured'}")
    if not run.suite.gpu:
        run.suite.facts["dry_peak_tflops"] = value  # the dry run's MFU peak: a CPU has no datasheet one
    copy = figures.get("memory_copy", {}).get("value")
    figure = f"{main.removeprefix('matmul_')} {value:.4g} TFLOP/s" + (
        f", copy {copy:.4g} GB/s" if copy else ""
    )
    return Outcome(PASS, figure, data={"compute": result})


def step_nvml(run: StepRun) -> Outcome:
    need_packages("prometheus_client", "pynvml", how="core dependencies of hpcpipe")
    gpu = run.suite.gpu
    port = free_port()
    steps = 150 if gpu else 10
    sets = [
        *run.suite.gpt_sets(),
        "train.compile=false",
        f"train.steps={steps}",
        "train.eval_every=0",
        f"observe.prometheus.port={port}",
        f"observe.gpu.interval_s={0.5 if gpu else 1}",
        f"run.out_dir={run.dir / 'runs'}",
        "run.name=nvml",
    ]
    if gpu:
        sets.append("train.global_batch_size=16")  # a step of ~0.1 s: many samples while it trains
    # The toy run sleeps 0.2 s a step (a straggler's hook, no CPU) so it trains long enough to be scraped.
    env = None if gpu else {"HPCPIPE_CHAOS_SLOW": "where=data,seconds=0.2"}
    proc, log = run.start(run.argv(["train", "gpt-124m", "--nproc", "1", *run.hpcpipe_sets(sets)]), env)
    scrapes = _scrape_while_running(run, proc, port)
    run.finish(proc, log)
    steps_seen = [s["hpcpipe_steps_total"] for s in scrapes if "hpcpipe_steps_total" in s]
    if len(steps_seen) < 2 or steps_seen[-1] <= steps_seen[0]:
        raise StepFailed(
            f"the exporter's hpcpipe_steps_total did not move over {len(scrapes)} scrapes: {steps_seen[:3]}"
        )
    gauges = [s for s in scrapes if "hpcpipe_gpu_utilization_ratio" in s]
    data: dict[str, Any] = {
        "port": port,
        "scrapes": len(scrapes),
        "scrapes_with_gpu": len(gauges),
        "first": scrapes[0],
        "last": scrapes[-1],
    }
    if not gpu:
        return _telemetry_off_outcome(run, scrapes, gauges, data)
    return _gauges_outcome(scrapes, gauges, data)


def _scrape_while_running(run: StepRun, proc: Command, port: int) -> list[dict[str, float]]:
    """The exporter's series every 0.3 s while ``proc`` runs, until the step's deadline (a scrape
    that fails is left out)."""
    scrapes: list[dict[str, float]] = []
    while proc.poll() is None and run.left() > 0:
        url = f"http://127.0.0.1:{port}/metrics"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            scrapes.append(parse_metrics(response.read().decode()))
        time.sleep(0.3)
    return scrapes


def _telemetry_off_outcome(
    run: StepRun, scrapes: list[dict[str, float]], gauges: list[dict[str, float]], data: dict[str, Any]
) -> Outcome:
    """Without a GPU: no scrape may carry GPU gauges, and the run must say why its telemetry is off."""
    from hpcpipe.observe.metrics import read_events

    off = [e for e in read_events(run.dir / "runs" / "nvml") if e.get("event") == "gpu_telemetry_off"]
    if gauges or not off:
        raise StepFailed(
            f"without a GPU: {len(gauges)} scrapes had GPU gauges, gpu_telemetry_off events {len(off)}"
        )
    data["gpu_telemetry_off"] = off[0]
    return Outcome(
        DRY,
        f"{len(scrapes)} scrapes, steps moved; telemetry off: {off[0].get('reason')}",
        "no GPU: the exporter ran, NVML said why it is off",
        data,
    )


def _gauges_outcome(
    scrapes: list[dict[str, float]], gauges: list[dict[str, float]], data: dict[str, Any]
) -> Outcome:
    """On a GPU: the hpcpipe_gpu_* gauges must be in the scrapes and move (energy, utilisation)."""
    if len(gauges) < 2:
        raise StepFailed(f"only {len(gauges)} of {len(scrapes)} scrapes carried hpcpipe_gpu_* gauges")
    energy = [s["hpcpipe_gpu_energy_joules_total"] for s in gauges if "hpcpipe_gpu_energy_joules_total" in s]
    util = [s["hpcpipe_gpu_utilization_ratio"] for s in gauges]
    power = [s.get("hpcpipe_gpu_power_watts", math.nan) for s in gauges]
    moved = (len(energy) >= 2 and energy[-1] > energy[0]) or len(set(util)) > 1
    data.update(energy_j=energy, utilization=util, power_w=power)
    if not moved or max(util) <= 0:
        raise StepFailed(
            f"the GPU gauges did not move: utilisation {sorted(set(util))[:5]}, "
            f"energy {energy[:1]}..{energy[-1:]}"
        )
    joules = energy[-1] - energy[0] if len(energy) >= 2 else math.nan
    figure = (
        f"{len(gauges)} scrapes: util max {max(util):.0%}, power max {max(power):.0f} W, +{joules:,.0f} J"
    )
    return Outcome(PASS, figure, data=data)


def step_checkpoint(run: StepRun) -> Outcome:
    path = run.dir / "checkpoint.json"
    sizes = (
        ["--device", "cuda", "--layers", "4", "--d-model", "1024", "--repeats", "3"]
        if run.suite.gpu
        else ["--device", "cpu", "--layers", "2", "--d-model", "128", "--repeats", "2"]
    )
    run.run(
        ["checkpoint", "--dir", str(run.dir), "--json", str(path), *sizes], script=HERE / "gpu_suite_steps.py"
    )
    result = json.loads(path.read_text())
    if not result["restored_equal"]:
        raise StepFailed(f"restored tensors differ from the saved ones: {result['differing'][:3]}")
    save, restore = result["ratios"]["save_vs_raw_write"], result["ratios"]["restore_vs_raw_read"]
    met = "met" if min(save, restore) >= CKPT_RATIO_GOAL else "missed"
    figure = f"{result['bytes'] / 1e6:,.0f} MB: save/raw {save:.2f}, restore/raw {restore:.2f}"
    if run.suite.gpu:
        return Outcome(PASS, figure + f" ({met}: >= {CKPT_RATIO_GOAL})", data=result)
    return Outcome(DRY, figure, "CPU tensors: no device-to-host copy in either arm", result)


SERVER_COMM = "hpcpipe-forksrv"  # launch/fork_server.py SERVER_NAME


def step_forkserver(run: StepRun) -> Outcome:
    gpu = run.suite.gpu
    control = gpu and _maps_libcuda_after_import(run)  # does `import torch` alone map the driver?
    steps = 60 if gpu else 4
    sets = [
        *run.suite.gpt_sets(),
        "train.compile=false",
        f"train.steps={steps}",
        "train.eval_every=0",
        "parallel.worker_start=forkserver",
        f"run.out_dir={run.dir / 'runs'}",
        "run.name=forkserver",
    ]
    if gpu:
        sets.append("train.global_batch_size=16")
    argv = run.argv(["train", "gpt-124m", "--nproc", "1", "--max-restarts", "1", *run.hpcpipe_sets(sets)])
    proc, log = run.start(argv)
    server, workers, names = _watch_fork_server(run, proc)
    run.finish(proc, log)
    data = {
        "server": server,
        "workers": {str(k): {"libcuda": v, "cmdline": names.get(k, "")} for k, v in workers.items()},
        "import_torch_maps_libcuda": control,
    }
    if server is None:
        raise StepFailed(
            f"no {SERVER_COMM} process seen under the launcher (did the agent start its own server?)"
        )
    if not workers:
        raise StepFailed(f"no worker seen under {SERVER_COMM} (pid {server['pid']})")
    if server["libcuda"] and not control:
        raise StepFailed(
            "the fork server mapped the CUDA driver (libcuda.so): CUDA was initialised in it, or in the "
            "launcher before it forked, before the workers were forked"
        )
    if not gpu:
        if any(workers.values()):
            raise StepFailed("a CPU dry run's worker mapped the CUDA driver")
        return Outcome(
            DRY,
            f"server pid {server['pid']}, {len(workers)} worker(s) forked, run finished",
            "no GPU: the workers trained on the CPU",
            data,
        )
    if not any(workers.values()):
        raise StepFailed("the worker never mapped the CUDA driver: it did not train on the GPU")
    note = "" if not control else "import torch alone maps libcuda here: the server check is inconclusive"
    cuda = sum(workers.values())
    return Outcome(
        PASS, f"server without CUDA, {cuda} of {len(workers)} forked with CUDA, run finished", note, data
    )


def _watch_fork_server(
    run: StepRun, proc: Command
) -> tuple[dict[str, Any] | None, dict[int, bool], dict[int, str]]:
    """Every 0.1 s while ``proc`` runs: the fork server under it (its pid, whether it ever mapped
    libcuda), the workers it forked (pid -> whether libcuda was mapped) and their command lines."""
    server: dict[str, Any] | None = None
    workers: dict[int, bool] = {}  # pid -> libcuda mapped (the latest look)
    names: dict[int, str] = {}  # pid -> command line
    while proc.poll() is None and run.left() > 0:
        tree = process_tree(proc.pid)
        for pid in tree:
            if read_proc(pid, "comm").strip() == SERVER_COMM:
                if server is None:
                    server = {"pid": pid, "libcuda": False}
                server["libcuda"] = server["libcuda"] or maps_libcuda(pid)
                for child in children(pid, tree):
                    workers[child] = workers.get(child, False) or maps_libcuda(child)
                    names.setdefault(child, read_proc(child, "cmdline").replace("\0", " ")[:200])
        time.sleep(0.1)
    return server, workers, names


def _maps_libcuda_after_import(run: StepRun) -> bool:
    code = "import torch, pathlib; print('libcuda.so' in pathlib.Path('/proc/self/maps').read_text())"
    out = subprocess.run(
        [run.suite.python, "-c", code],
        capture_output=True,
        text=True,
        timeout=max(run.left(), 1),
        check=False,
        cwd=REPO,
    )
    return out.stdout.strip() == "True"
