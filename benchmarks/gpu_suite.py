"""The GPU checklist (``GPU-CHECKLIST.md``) in one command: each item a step, a table, JSON files.

    python benchmarks/gpu_suite.py                       # on a GPU machine: real sizes, ~8 minutes
    python benchmarks/gpu_suite.py --cpu-dry-run         # the same steps at toy size on a CPU
    python benchmarks/gpu_suite.py --only gpt,oom --out runs/gpu-suite-try
    python benchmarks/gpu_suite.py --list                # the steps, what each runs and checks

Every step runs the real CLI (``python -m hpcpipe ...``) or a script of this directory in a
subprocess with its own timeout, so a step that fails is recorded (FAIL and one line saying why)
and the others still run. The steps, in the checklist's order:

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
figure (a CPU has no datasheet peak).

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
import contextlib
import importlib.util
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SMOLLM2_GGUF = REPO / "data" / "external" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
BREAK_FLAG = "--gpu-suite-broken-on-purpose"  # appended to a --break-step step's commands

PASS, FAIL, SKIP, DRY = "PASS", "FAIL", "SKIP", "DRY-RUN"
MFU_GOAL = 0.45  # GPU-CHECKLIST.md item 3 (llm.c reaches about 41% per GPU on 8xH100)
OOM_RATIO_GOAL = 0.95  # item 4
CKPT_RATIO_GOAL = 0.8  # benchmarks/README.md: save, restore >= 0.8 of raw

# gpt-124m at a size one GPU runs a step of quickly: micro 16 (the preset's), 8 accumulation
# steps; bf16 and torch.compile as the preset has them.
GPU_GPT = ("train.global_batch_size=128",)
DRY_GPT = (
    "model.n_layers=2",
    "model.d_model=64",
    "model.n_heads=2",
    "model.seq_len=64",
    "data.tokenizer=bytes",
    "data.max_bytes=200000",
    "train.micro_batch_size=4",
    "train.global_batch_size=8",
    "train.precision=fp32",
    "train.compile=false",
)


class StepFailed(Exception):
    """A step's command failed or a check did not hold: the one line of its FAIL."""


class StepSkipped(Exception):
    """Something the step needs is not on this machine: the one line of its SKIP."""


@dataclass
class Outcome:
    status: str
    figure: str = ""
    reason: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Suite:
    """What every step reads: the mode, where things go, what earlier steps measured."""

    gpu: bool
    out: Path
    prepared: Path
    python: str
    gpus: int
    smollm2: Path
    break_step: str | None
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def images(self) -> Path:
        return self.out / "data" / "cifar10"

    def gpt_sets(self) -> tuple[str, ...]:
        return GPU_GPT if self.gpu else DRY_GPT


class StepRun:
    """One step's commands: each a subprocess in its own session, logged under <out>/<step>/, and
    killed (its whole process group) at the step's deadline."""

    def __init__(self, suite: Suite, name: str, deadline: float) -> None:
        self.suite = suite
        self.name = name
        self.deadline = deadline
        self.dir = suite.out / name
        if self.dir.exists():  # an --out used before: its runs would resume instead of train
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        self.commands: list[dict[str, Any]] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def argv(self, args: Sequence[str], script: Path | None = None) -> list[str]:
        head = [self.suite.python, str(script)] if script else [self.suite.python, "-m", "hpcpipe"]
        broken = [BREAK_FLAG] if self.suite.break_step == self.name else []
        return [*head, *args, *broken]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        # A GPU run must meet real faults only: no injected ones inherited from the caller.
        env = {k: v for k, v in os.environ.items() if not k.startswith("HPCPIPE_CHAOS_")}
        env.update(extra or {})
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def start(
        self, argv: list[str], env: Mapping[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.dir / f"{len(self.commands):02d}-{_slug(argv)}.log"
        self.commands.append({"argv": argv, "log": str(log.relative_to(self.suite.out))})
        handle = log.open("wb")
        try:
            proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env=self.env(env),
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a timeout kills the workers too
            )
        finally:
            handle.close()
        return proc, log

    def finish(self, proc: subprocess.Popen[bytes], log: Path, ok: Sequence[int] = (0,)) -> int:
        """Wait for ``proc`` until the deadline; StepFailed on a timeout or an exit code not in ``ok``."""
        started = time.monotonic()
        try:
            code = proc.wait(timeout=max(self.left(), 0.1))
        except subprocess.TimeoutExpired:
            stop(proc)
            self.commands[-1].update(rc=None, seconds=round(time.monotonic() - started, 1))
            waited = time.monotonic() - started
            raise StepFailed(
                f"timed out after {waited:.0f} s (the step's share of the budget): {_cmd(proc.args)}"
            ) from None
        self.commands[-1].update(rc=code, seconds=round(time.monotonic() - started, 1))
        if code not in ok:
            raise StepFailed(f"`{_cmd(proc.args)}` exited {code}: {last_line(log)}")
        return code

    def run(
        self,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        script: Path | None = None,
        ok: Sequence[int] = (0,),
    ) -> int:
        proc, log = self.start(self.argv(args, script), env)
        return self.finish(proc, log, ok)

    def hpcpipe_sets(self, sets: Sequence[str]) -> list[str]:
        out: list[str] = []
        for item in (f"data.prepared_dir={self.suite.prepared}", *sets):
            out += ["--set", item]
        return out

    def throughput(
        self,
        preset: str,
        sets: Sequence[str],
        nproc: int,
        steps: int,
        warmup: int,
        label: str,
        env: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """``hpcpipe bench throughput``'s JSON (medians over the measured steps of one run)."""
        json_path = self.dir / f"{label}.json"
        peak = self.suite.facts.get("dry_peak_tflops")
        extra = () if self.suite.gpu or not peak else (f"observe.peak_tflops={peak:.6g}",)
        args = [
            "bench",
            "throughput",
            preset,
            "--nproc",
            str(nproc),
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            "--out",
            str(self.dir / "runs" / label),
            "--json",
            str(json_path),
            *self.hpcpipe_sets([*sets, *extra]),
        ]
        self.run(args, env)
        result: dict[str, Any] = json.loads(json_path.read_text())
        result["mfu_peak"] = (
            "datasheet (observe/flops.py)"
            if self.suite.gpu
            else ("bench compute's measured fp32 matmul" if extra else "none (a CPU has no datasheet peak)")
        )
        return result


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    weight: float
    fn: Callable[[StepRun], Outcome]


# -- steps -----------------------------------------------------------------------------------------


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
    sizes = (
        []
        if run.suite.gpu
        else ["--matmul-n", "256", "--copy-size", "16M", "--min-time", "0.05", "--repeats", "1"]
    )
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


def _tokens_figure(result: Mapping[str, Any], goal: float | None = None) -> str:
    unit = "tok/s" if result["unit"] == "tokens" else "img/s"
    text = f"{result['per_s_per_device']:,.4g} {unit}/device"
    mfu = result.get("mfu")
    if mfu is not None:
        text += f", MFU {mfu:.1%}"
        if goal is not None:
            text += f" ({'met' if mfu >= goal else 'missed'}: goal >= {goal:.0%})"
    return text


def step_gpt(run: StepRun) -> Outcome:
    steps, warmup = (20, 5) if run.suite.gpu else (2, 0)
    result = run.throughput("gpt-124m", run.suite.gpt_sets(), 1, steps, warmup, "gpt")
    if not result["per_s"] > 0:
        raise StepFailed(f"no throughput measured: {result['per_s']}")
    goal = MFU_GOAL if run.suite.gpu else None
    note = "" if run.suite.gpu else "toy GPT, fp32, no torch.compile on a CPU"
    return Outcome(PASS, _tokens_figure(result, goal), note, {"throughput": result, "mfu_goal": MFU_GOAL})


def _ranks_for_sharding(run: StepRun) -> int:
    """2 ranks: on a GPU machine only with 2 GPUs (NCCL puts one rank on one GPU); SKIP otherwise."""
    if run.suite.gpu and run.suite.gpus < 2:
        raise StepSkipped(
            f"needs 2 GPUs, this machine has {run.suite.gpus}: hpcpipe trains one process unwrapped "
            "(parallel.strategy resolves to single at world size 1) and NCCL cannot put 2 ranks on one GPU"
        )
    return 2


def _layout_strategy(result: Mapping[str, Any]) -> str | None:
    from hpcpipe.observe.metrics import read_events

    events = read_events(Path(result["runs"][0]["run_dir"]))
    layouts = [e for e in events if e.get("event") == "layout"]
    return layouts[-1].get("strategy") if layouts else None


def _sharded(run: StepRun, strategy: str, sets: Sequence[str]) -> Outcome:
    nproc = _ranks_for_sharding(run)
    steps, warmup = (15, 5) if run.suite.gpu else (2, 0)
    result = run.throughput("gpt-124m", [*run.suite.gpt_sets(), *sets], nproc, steps, warmup, strategy)
    seen = _layout_strategy(result)
    if seen != strategy:
        raise StepFailed(f"the run's layout event says strategy {seen}, not {strategy}")
    note = "" if run.suite.gpu else f"{nproc} gloo ranks on the CPU"
    return Outcome(PASS, f"{nproc} ranks, " + _tokens_figure(result), note, {"throughput": result})


def step_fsdp2(run: StepRun) -> Outcome:
    return _sharded(run, "fsdp", ["parallel.strategy=fsdp"])


def step_deepspeed(run: StepRun) -> Outcome:
    _need_packages("deepspeed", how="pip install 'hpcpipe[deepspeed]'")
    # DeepSpeed refuses train.compile (docs/deepspeed.md): the same job in eager mode.
    return _sharded(
        run, "deepspeed", ["parallel.strategy=deepspeed", "parallel.zero_stage=3", "train.compile=false"]
    )


def step_oom(run: StepRun) -> Outcome:
    from hpcpipe.observe.metrics import read_events

    gpu = run.suite.gpu
    # Eager mode: recovery changes the batch's shape, and torch.compile would compile again.
    base = [*run.suite.gpt_sets(), "train.compile=false"]
    steps, warmup = (5, 3) if gpu else (2, 1)
    data: dict[str, Any] = {}
    if gpu:
        micro = _oom_micro_batch(run, base, data)
        env = None
    else:
        micro, env = 8, {"HPCPIPE_CHAOS_OOM": "step=1"}  # the fault-injection hook: a simulated OOM
    sets = [*base, f"train.global_batch_size={micro}"]
    first = run.throughput(
        "gpt-124m", [*sets, f"train.micro_batch_size={micro}"], 1, steps, warmup, "oom", env
    )
    events = [e for e in read_events(Path(first["runs"][0]["run_dir"])) if e.get("event") == "oom_recovered"]
    if not events:
        raise StepFailed(f"no oom_recovered event: micro-batch {micro} fit, or the run did not recover")
    final = int(events[-1]["new_micro_batch_size"])
    reference = run.throughput(
        "gpt-124m", [*sets, f"train.micro_batch_size={final}"], 1, steps, warmup, "reference"
    )
    ratio = first["per_s"] / reference["per_s"]
    verdict = "met" if ratio >= OOM_RATIO_GOAL else "missed"
    figure = f"micro {micro}->{final} ({len(events)} recoveries), ratio {ratio:.3f}"
    figure += f" ({verdict}: >= {OOM_RATIO_GOAL})" if gpu else ""
    data.update(oom_events=events, recovered=first, reference=reference, ratio=ratio, goal=OOM_RATIO_GOAL)
    if gpu:
        return Outcome(PASS, figure, data=data)
    return Outcome(DRY, figure, "simulated OOM (HPCPIPE_CHAOS_OOM), not a CUDA one", data)


PROBE_MICRO = 32
OOM_TRAIN_OVER = 1.3  # the OOM run's training needs this many times the GPU's memory ...
OOM_EVAL_UNDER = 0.8  # ... while its evaluation needs at most this share of it


def choose_oom_micro_batch(
    total: float, train_per_sample: float, eval_per_sample: float, multiple: int = PROBE_MICRO
) -> int | None:
    """The smallest multiple of ``multiple`` whose training needs >= 1.3x the GPU's ``total``
    bytes, while its evaluation needs <= 0.8x: the trainer evaluates at step 0 at the configured
    micro-batch, outside OOM recovery, so that evaluation must fit. None when no micro-batch
    does both."""
    micro = multiple * max(1, math.ceil(OOM_TRAIN_OVER * total / train_per_sample / multiple))
    return micro if micro * eval_per_sample <= OOM_EVAL_UNDER * total else None


def _oom_micro_batch(run: StepRun, base: Sequence[str], data: dict[str, Any]) -> int:
    """A micro-batch of gpt-124m that this GPU cannot train but can evaluate, from a probe run's
    measured peak memory per sequence (training) and the logits' bytes per sequence (evaluation:
    bf16 logits, their fp32 copy and log-softmax, 10 bytes per vocabulary entry and position)."""
    import yaml

    from hpcpipe.layout import RunLayout
    from hpcpipe.observe.metrics import read_events, read_metrics

    total = gpu_memory_bytes()
    sets = [*base, f"train.global_batch_size={PROBE_MICRO}", f"train.micro_batch_size={PROBE_MICRO}"]
    probe = run.throughput("gpt-124m", sets, 1, 2, 1, "probe")
    run_dir = Path(probe["runs"][0]["run_dir"])
    peak = max(int(r["mem_bytes"]) for r in read_metrics(run_dir) if r.get("mem_bytes"))
    shrunk = [e for e in read_events(run_dir) if e.get("event") == "oom_recovered"]
    probed = int(shrunk[-1]["new_micro_batch_size"]) if shrunk else PROBE_MICRO
    config = yaml.safe_load(RunLayout(run_dir).config.read_text())
    eval_per_sample = 10.0 * config["data"]["vocab_size"] * config["model"]["seq_len"]
    train_per_sample = peak / probed
    micro = choose_oom_micro_batch(total, train_per_sample, eval_per_sample)
    data.update(
        gpu_memory_bytes=total,
        probe_peak_bytes=peak,
        probe_micro_batch=probed,
        train_bytes_per_sequence=train_per_sample,
        eval_bytes_per_sequence=eval_per_sample,
        oom_micro_batch=micro,
    )
    if micro is None:
        raise StepSkipped(
            f"no micro-batch of gpt-124m needs >= {OOM_TRAIN_OVER}x this GPU's {total / 2**30:.0f} GiB "
            f"to train ({train_per_sample / 2**20:.0f} MiB a sequence) and <= {OOM_EVAL_UNDER}x to evaluate "
            f"({eval_per_sample / 2**20:.0f} MiB)"
        )
    return micro


def step_resnet(run: StepRun) -> Outcome:
    base = [f"data.root={run.suite.images}"]
    if run.suite.gpu:
        sets, steps, warmup = [*base, "train.global_batch_size=128"], 20, 5  # micro 128, bf16, channels_last
    else:
        sets = [
            *base,
            "model.variant=resnet18-imagenet",
            "train.micro_batch_size=4",
            "train.global_batch_size=4",
            "train.precision=fp32",
            "data.num_workers=0",
            "data.persistent_workers=false",
            "data.pin_memory=false",
            "data.prefetch_factor=null",
        ]
        steps, warmup = 2, 0
    result = run.throughput("resnet18-cifar10", sets, 1, steps, warmup, "resnet")
    note = (
        "" if run.suite.gpu else "ResNet-18 with the ImageNet stem (16x fewer FLOPs), fp32, 4 images a step"
    )
    return Outcome(PASS, _tokens_figure(result), note, {"throughput": result})


def _need_packages(*names: str, how: str = "pip install 'hpcpipe[lora]'") -> None:
    """StepSkipped naming the modules of ``names`` this interpreter cannot import."""
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        raise StepSkipped(f"needs {', '.join(missing)} ({how}, or bring the wheels)")


LORA_DRY = (
    "model.seq_len=256",
    "data.synthetic_rows=40",
    "train.micro_batch_size=1",
    "train.global_batch_size=1",
)


def step_lora_smollm2(run: StepRun) -> Outcome:
    source = run.suite.smollm2
    if not source.exists():
        raise StepSkipped(f"no SmolLM2 model at {source} (`make fc-assets`, or --smollm2 PATH)")
    _need_packages("peft", *(("gguf", "accelerate") if source.suffix == ".gguf" else ()))
    if source.suffix == ".gguf":
        model = [f"model.name_or_path={source.parent}", f"model.gguf_file={source.name}"]
    else:
        model = [f"model.name_or_path={source}", "model.gguf_file=null"]
    if run.suite.gpu:
        sets = [
            *model,
            "model.base_dtype=bf16",
            "train.precision=bf16",
            "train.micro_batch_size=8",
            "train.global_batch_size=8",
        ]
        steps, warmup = 10, 3
    else:
        sets, steps, warmup = [*model, *LORA_DRY], 1, 0
    result = run.throughput("lora-fc-smollm2", sets, 1, steps, warmup, "lora")
    note = "" if run.suite.gpu else "256-token rows, one a step"
    return Outcome(PASS, _tokens_figure(result), note, {"throughput": result})


def step_lora_qwen2(run: StepRun) -> Outcome:
    _need_packages("peft")
    if run.suite.gpu:
        # The preset's own recipe for one GPU (its header): seq 4096, micro 2, bf16 base, gradient
        # checkpointing, LoRA r64 on every projection; global batch 8 = 4 accumulation steps.
        sets = [
            "model.name_or_path=@random:qwen2-7b",
            'data.sources=["@synthetic"]',
            "data.synthetic_rows=1000",
            "train.global_batch_size=8",
        ]
        steps, warmup = 4, 2
    else:
        sets = [
            "model.name_or_path=@random:qwen2-tiny",
            'data.sources=["@synthetic"]',
            *LORA_DRY,
            "train.global_batch_size=2",
            "model.base_dtype=fp32",
            "train.precision=fp32",
        ]
        steps, warmup = 2, 0
    result = run.throughput("lora-fc-qwen2-7b", sets, 1, steps, warmup, "lora")
    note = "" if run.suite.gpu else "Qwen2's architecture at 2 layers, width 64 (@random:qwen2-tiny)"
    return Outcome(PASS, _tokens_figure(result), note, {"throughput": result})


def step_nvml(run: StepRun) -> Outcome:
    from hpcpipe.observe.metrics import read_events

    _need_packages("prometheus_client", "pynvml", how="core dependencies of hpcpipe")
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
    scrapes: list[dict[str, float]] = []
    while proc.poll() is None and run.left() > 0:
        url = f"http://127.0.0.1:{port}/metrics"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            scrapes.append(parse_metrics(response.read().decode()))
        time.sleep(0.3)
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


# -- /proc, metrics, processes ---------------------------------------------------------------------


def read_proc(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_text(errors="replace")
    except OSError:
        return ""


def maps_libcuda(pid: int) -> bool:
    """Whether the CUDA driver library is mapped into ``pid`` (loaded by CUDA's initialisation)."""
    return "libcuda.so" in read_proc(pid, "maps")


def _parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = read_proc(int(entry.name), "stat")
            if stat:
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def process_tree(root: int) -> dict[int, int]:
    """``root``'s descendants: pid -> parent pid."""
    parents = _parents()
    tree: dict[int, int] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree[child] = parent
                frontier.append(child)
    return tree


def children(pid: int, tree: Mapping[int, int]) -> list[int]:
    return [child for child, parent in tree.items() if parent == pid]


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the command's process group, SIGKILL 10 s later if anything is left."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            return


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {series name: value} (the first sample of each name)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) not in values:
            with contextlib.suppress(ValueError):
                values[match.group(1)] = float(match.group(3))
    return values


_BOX = "│╭╮╰╯─┃┏┓┗┛━ \t"


def last_line(log: Path) -> str:
    """The last meaningful line of a command's output: hpcpipe's one-line error (a usage error's
    box drawn around it taken off), or a traceback's last line."""
    lines = [ln.strip(_BOX) for ln in log.read_text(errors="replace").splitlines()]
    lines = [ln for ln in lines if ln]
    return lines[-1][:300] if lines else "(no output)"


def _cmd(argv: Any) -> str:
    parts = [str(a) for a in argv]
    if parts[:3] and parts[1:3] == ["-m", "hpcpipe"]:
        parts = ["hpcpipe", *parts[3:]]
    elif len(parts) > 1 and parts[1].endswith(".py"):
        parts = [Path(parts[1]).name, *parts[2:]]
    text = " ".join(parts)
    return text if len(text) <= 160 else text[:157] + "..."


def _slug(argv: Sequence[str]) -> str:
    words = [
        a for a in argv[1:] if not a.startswith("-") and "/" not in a and "=" not in a and a != "hpcpipe"
    ]
    return re.sub(r"[^a-z0-9]+", "-", "-".join(words[:3]).lower()).strip("-") or "cmd"


def gpu_memory_bytes() -> int:
    """The memory of the first visible GPU (nvidia-smi; CUDA_VISIBLE_DEVICES's first index)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    sizes = [int(line.strip()) for line in out.stdout.splitlines() if line.strip()]
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    index = int(first) if first.isdigit() and int(first) < len(sizes) else 0
    return sizes[index] * 2**20  # MiB


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's waited-for children (all of their descendants)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def count_gpus() -> int:
    """Visible GPUs without touching CUDA in this process: nvidia-smi -L, CUDA_VISIBLE_DEVICES."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False, timeout=30)
    found = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        found = min(found, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))
    return found


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
            "cpu_s": round(children_cpu_s() - cpu, 1),  # user + system of its finished commands
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
    counts = {status: sum(r["status"] == status for r in records) for status in (PASS, DRY, SKIP, FAIL)}
    summary = {
        "suite": "gpu_suite",
        "mode": "gpu" if suite.gpu else "cpu-dry-run",
        "gpus": gpus,
        "budget_s": budget,
        "total_s": round(total, 1),
        "started_utc": stamp,
        "out": str(out),
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
