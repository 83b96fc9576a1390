"""The GPU checklist (``GPU-CHECKLIST.md``) in one command: each item a step, a table, JSON files.

    python benchmarks/gpu_suite.py                       # on a GPU machine: real sizes, ~8 minutes
    python benchmarks/gpu_suite.py --cpu-dry-run         # the same steps at toy size on a CPU
    python benchmarks/gpu_suite.py --only gpt,oom --out runs/gpu-suite-try
    python benchmarks/gpu_suite.py --list                # the steps, what each runs and checks

Every step runs the real CLI (``python -m hpcpipe ...``) or a script of this directory in a
subprocess with its own timeout, so a step that fails is recorded (FAIL and one line saying why)
and the others still run. On a GPU each command is a fresh interpreter, as a user starts it; the
CPU dry run forks its commands from hpcpipe's zygote
(``hpcpipe.launch.zygote``, as ``recipe check`` does), so torch and the trainer are imported once,
not once per command (``HPCPIPE_FRESH_INTERPRETERS=1`` starts each fresh there too). The steps,
in the checklist's order:

  prepare        the data the steps train on (gpt-124m's BPE tokens of the standard library,
                 generated CIFAR-10 images); kept in --prepared-dir, so only the first run pays
  doctor         `hpcpipe doctor`: GPU: the cuda, nccl and NVML rows must say OK (and no row FAIL)
  compute        `hpcpipe bench compute`: matmul TFLOP/s per dtype, memory-copy GB/s
  gpt            `hpcpipe bench throughput gpt-124m`, one GPU, bf16 + torch.compile: tokens/s and
                 MFU (the trainer's: measured tokens/s x the model's FLOPs per token / peak)
  fsdp2          the same job under parallel.strategy=fsdp; the run's `layout` event must say fsdp
  deepspeed      the same under parallel.strategy=deepspeed, ZeRO-3 (needs the deepspeed package)
  oom            gpt-124m (eager) with a micro-batch this GPU cannot train, chosen from a probe
                 run's measured memory per sequence (and small enough for the step-0 evaluation,
                 which runs outside recovery, to fit): the run must log `oom_recovered`, finish,
                 and keep >= 0.95 of the throughput of a run started at the micro-batch it
                 recovered to
  resnet         `hpcpipe bench throughput resnet18-cifar10` (bf16, channels_last): images/s
  lora-smollm2   LoRA function calling on SmolLM2-135M-Instruct (--smollm2; needs peft, and gguf +
                 accelerate for the GGUF file): tokens/s and MFU
  lora-qwen2-7b  the same recipe on Qwen2-7B's shape with random weights (model.name_or_path
                 @random:qwen2-7b: config only, weights initialised from the config, LoRA r64)
  nvml           a training run with the Prometheus exporter on, scraped while it trains: the
                 hpcpipe_gpu_* gauges must be there and move (energy, utilisation)
  checkpoint     CheckpointStore save/restore of a GPT and its AdamW state held on the GPU, against
                 a raw device-to-host copy + write + fsync and read + host-to-device copy of the
                 same bytes; the restored tensors must equal the saved ones bit for bit
  forkserver     `hpcpipe train --max-restarts 1` starts its worker through hpcpipe's fork server:
                 the server (hpcpipe-forksrv) must not have the CUDA driver loaded (nothing touched
                 CUDA before the fork), the worker must use CUDA, and the run must finish

Statuses: PASS (the step ran and its checks held); FAIL (its command failed, timed out or a check
did not hold: one line says which); SKIP (something it needs is absent here: a package, a model
file, a second GPU; one line says what); DRY-RUN (--cpu-dry-run only: the step's subject needs
CUDA, a real CUDA OOM, NVML gauges, CUDA workers, GPU tensors, the GPU rows of doctor, so its CPU
analogue ran instead and its checks held; never a GPU PASS). Targets from the checklist (MFU >=
45%, OOM throughput >= 0.95, checkpoint save/restore >= 0.8 of raw) are shown beside the figure,
met or missed; they do not make a step FAIL. The exit code is 1 when any step FAILed, else 0.

--cpu-dry-run runs the same steps through the same commands at toy sizes on the CPU (a 2-layer
GPT in fp32 without torch.compile, 2 gloo ranks for FSDP2 and ZeRO-3, a simulated OOM through
HPCPIPE_CHAOS_OOM, a 2-layer Qwen2 shape, CPU tensors for the checkpoint), so the suite is known
to work before a GPU runs it; the test suite runs it (tests/e2e/test_gpu_suite_dry_run.py). Its
figures measure nothing. Its MFU is taken against the compute step's measured fp32 matmul
figure (a CPU has no datasheet peak; n = 1024, median of 3 windows), so it reads high or even
above 100% when other work took the cores while that figure was measured.

On one GPU, fsdp2 and deepspeed SKIP: hpcpipe trains a single process unwrapped
(``parallel.resolve_strategy`` makes world size 1 "single" and refuses deepspeed there) and NCCL
cannot place two ranks on one GPU; with two or more GPUs they run on two.

The whole suite has a time budget (--budget: 480 s on a GPU, 600 s for the dry run); each step
gets a share of it by its weight, plus what the steps before it left unused. --out (default
runs/gpu-suite-<UTC date and time>) receives <step>.json per step (status, figure, the commands,
their logs under <step>/, the figures read back) and summary.json; the table prints last, then
one JSON line with the run's context (benchmarks/harness.py).

Installing on a GPU machine without network: the GPU-CHECKLIST.md's notes (pip install --no-deps
-e . plus the missing wheels). Steps that need an optional package (deepspeed, peft, gguf) SKIP
without it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpu_suite_proc import children_cpu_s, count_gpus
from gpu_suite_run import DRY, FAIL, PASS, REPO, SKIP, Outcome, Step, StepFailed, StepRun, StepSkipped, Suite
from gpu_suite_system_steps import (
    step_checkpoint,
    step_compute,
    step_doctor,
    step_forkserver,
    step_nvml,
    step_prepare,
)
from gpu_suite_train_steps import (
    step_deepspeed,
    step_fsdp2,
    step_gpt,
    step_lora_qwen2,
    step_lora_smollm2,
    step_oom,
    step_resnet,
)

SMOLLM2_GGUF = REPO / "data" / "external" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

STEPS: tuple[Step, ...] = (
    Step("prepare", "data for the steps (first run on a machine only)", 40, step_prepare),
    Step("doctor", "hpcpipe doctor: GPU, NVML, NCCL rows", 10, step_doctor),
    Step("compute", "hpcpipe bench compute: matmul and copy ceilings", 25, step_compute),
    Step("gpt", "gpt-124m bf16 + compile, 1 GPU: tokens/s, MFU", 60, step_gpt),
    Step("fsdp2", "gpt-124m under FSDP2", 40, step_fsdp2),
    Step("deepspeed", "gpt-124m under DeepSpeed ZeRO-3", 40, step_deepspeed),
    Step("oom", "a real CUDA OOM, recovered; throughput after it", 60, step_oom),
    Step("resnet", "ResNet-18 bf16 channels_last: images/s", 30, step_resnet),
    Step("lora-smollm2", "LoRA on SmolLM2-135M: tokens/s", 35, step_lora_smollm2),
    Step("lora-qwen2-7b", "LoRA on Qwen2-7B's shape, random weights: tokens/s", 90, step_lora_qwen2),
    Step("nvml", "Prometheus exporter + NVML gauges while training", 30, step_nvml),
    Step("checkpoint", "save/restore of GPU tensors vs raw I/O", 25, step_checkpoint),
    Step("forkserver", "fork server starting CUDA workers", 25, step_forkserver),
)


# -- the suite ---------------------------------------------------------------------------------------


def run_suite(suite: Suite, steps: Sequence[Step], budget: float) -> list[dict[str, Any]]:
    total_weight = sum(s.weight for s in steps)
    suite_end = time.monotonic() + budget
    carry = 0.0
    records = []
    for step in steps:
        share = budget * step.weight / total_weight
        allowed = min(share + carry, suite_end - time.monotonic())
        start, cpu = time.monotonic(), children_cpu_s()
        run = StepRun(suite, step.name, start + max(allowed, 0.0))
        print(f"[gpu-suite] {step.name}: {step.title} (up to {allowed:.0f} s)", flush=True)
        if allowed < 1:
            outcome = Outcome(FAIL, reason=f"not started: the suite's budget of {budget:.0f} s was spent")
        else:
            outcome = _run_step(step, run)
        seconds = time.monotonic() - start
        carry = max(share + carry - seconds, 0.0)
        record = {
            "step": step.name,
            "title": step.title,
            "mode": "gpu" if suite.gpu else "cpu-dry-run",
            "status": outcome.status,
            "figure": outcome.figure,
            "reason": outcome.reason,
            "seconds": round(seconds, 1),
            # user + system of its finished commands: its own children's, and what the zygote reaped
            "cpu_s": round(children_cpu_s() - cpu + run.forked_cpu_s, 1),
            "timeout_s": round(allowed, 1),
            "commands": run.commands,
            "data": outcome.data,
        }
        (suite.out / f"{step.name}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(
            f"[gpu-suite] {step.name}: {outcome.status} {outcome.figure or outcome.reason} ({seconds:.1f} s)",
            flush=True,
        )
        records.append(record)
    return records


def _run_step(step: Step, run: StepRun) -> Outcome:
    try:
        return step.fn(run)
    except StepSkipped as exc:
        return Outcome(SKIP, reason=str(exc))
    except StepFailed as exc:
        return Outcome(FAIL, reason=str(exc))
    except Exception as exc:  # a bug or an unexpected file: the step fails, the suite goes on
        return Outcome(
            FAIL, reason=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        )


def print_table(records: Sequence[Mapping[str, Any]], gpu: bool) -> None:
    width = max(len(r["step"]) for r in records)
    print()
    print(
        "GPU checklist"
        if gpu
        else "GPU checklist, CPU DRY RUN: toy sizes on the CPU; the figures measure nothing"
    )
    print(f"{'step':<{width}}  {'status':<7}  {'seconds':>7}  figure / reason")
    for r in records:
        text = r["figure"] if r["status"] in (PASS, DRY) else r["reason"]
        if r["status"] in (PASS, DRY) and r["reason"]:
            text += f" [{r['reason']}]"
        print(f"{r['step']:<{width}}  {r['status']:<7}  {r['seconds']:>7.1f}  {text}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpu_suite.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="run every step at toy size on the CPU (no GPU needed; what the test suite runs)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for <step>.json, summary.json and the logs (default: runs/gpu-suite-<UTC time>)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for the whole suite, shared by the steps' weights (default: 480 on a GPU, "
        "600 for the dry run)",
    )
    parser.add_argument(
        "--only", default=None, help="comma-separated steps to run (see --list); the rest are left out"
    )
    parser.add_argument("--skip", default=None, help="comma-separated steps to leave out")
    parser.add_argument(
        "--prepared-dir",
        type=Path,
        default=REPO / "data" / "prepared",
        help="data.prepared_dir of every step: prepared data are reused across runs (default: %(default)s)",
    )
    parser.add_argument(
        "--smollm2",
        type=Path,
        default=SMOLLM2_GGUF,
        help="SmolLM2-135M-Instruct: its GGUF file (`make fc-assets`) or a Hugging Face model directory",
    )
    parser.add_argument(
        "--break-step",
        default=None,
        metavar="STEP",
        help="make STEP's commands fail on purpose (an unknown option): to see a FAIL recorded "
        "while the other steps go on, as the suite's own test does",
    )
    parser.add_argument("--list", action="store_true", help="print the steps and exit")
    return parser.parse_args(argv)


def _select(args: argparse.Namespace) -> list[Step]:
    names = [s.name for s in STEPS]
    only = [n.strip() for n in args.only.split(",")] if args.only else names
    skip = {n.strip() for n in args.skip.split(",")} if args.skip else set()
    unknown = sorted((set(only) | skip | ({args.break_step} if args.break_step else set())) - set(names))
    if unknown:
        raise SystemExit(f"gpu_suite.py: unknown step(s) {', '.join(unknown)}; the steps: {', '.join(names)}")
    return [s for s in STEPS if s.name in only and s.name not in skip]


def _summary(
    suite: Suite, records: Sequence[Mapping[str, Any]], budget: float, total: float, stamp: str
) -> dict[str, Any]:
    """summary.json: the run's context, the count of each status, and each step's record less its
    commands and data."""
    counts = {status: sum(r["status"] == status for r in records) for status in (PASS, DRY, SKIP, FAIL)}
    return {
        "suite": "gpu_suite",
        "mode": "gpu" if suite.gpu else "cpu-dry-run",
        "gpus": suite.gpus,
        "budget_s": budget,
        "total_s": round(total, 1),
        "started_utc": stamp,
        "out": str(suite.out),
        "counts": counts,
        "failed": [r["step"] for r in records if r["status"] == FAIL],
        "steps": [
            {
                k: r[k]
                for k in ("step", "title", "status", "figure", "reason", "seconds", "cpu_s", "timeout_s")
            }
            for r in records
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    steps = _select(args)
    if args.list:
        for s in STEPS:
            print(f"{s.name:<14} {s.title}")
        return 0
    gpus = 0 if args.cpu_dry_run else count_gpus()
    if not args.cpu_dry_run and gpus == 0:
        print(
            "gpu_suite.py: no NVIDIA GPU visible (nvidia-smi -L); on a CPU run --cpu-dry-run", file=sys.stderr
        )
        return 2
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out = (args.out or REPO / "runs" / f"gpu-suite-{stamp}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    budget = args.budget if args.budget is not None else (600.0 if args.cpu_dry_run else 480.0)
    suite = Suite(
        gpu=not args.cpu_dry_run,
        out=out,
        prepared=args.prepared_dir.resolve(),
        python=sys.executable,
        gpus=gpus,
        smollm2=args.smollm2.resolve(),
        break_step=args.break_step,
    )
    started = time.monotonic()
    records = run_suite(suite, steps, budget)
    total = time.monotonic() - started
    summary = _summary(suite, records, budget, total, stamp)
    counts = summary["counts"]
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_table(records, suite.gpu)
    print(
        f"{counts[PASS]} PASS, {counts[DRY]} DRY-RUN, {counts[SKIP]} SKIP, {counts[FAIL]} FAIL "
        f"in {total:.0f} s "
        f"(budget {budget:.0f} s); JSON in {out}"
    )
    from harness import emit

    emit(
        {
            "benchmark": "gpu_suite",
            "mode": summary["mode"],
            "statuses": {r["step"]: r["status"] for r in records},
            "total_s": summary["total_s"],
            "out": str(out),
        }
    )
    return 1 if counts[FAIL] else 0


if __name__ == "__main__":
    sys.exit(main())
