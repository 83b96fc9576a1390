"""The GPU suite's machinery (``gpu_suite.py``): the statuses, what a step returns (Outcome) or
raises (StepFailed, StepSkipped), the suite's settings (Suite), one step's commands run as logged
subprocesses under its deadline (StepRun), and a step's entry in the list (Step)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_suite_proc import Command, ForkedCommand, stop

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BREAK_FLAG = "--gpu-suite-broken-on-purpose"  # appended to a --break-step step's commands

PASS, FAIL, SKIP, DRY = "PASS", "FAIL", "SKIP", "DRY-RUN"

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
        self.forked_cpu_s = 0.0  # CPU of the commands forked from the zygote (the dry run's)

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

    def start(self, argv: list[str], env: Mapping[str, str] | None = None) -> tuple[Command, Path]:
        log = self.dir / f"{len(self.commands):02d}-{_slug(argv)}.log"
        self.commands.append({"argv": argv, "log": str(log.relative_to(self.suite.out))})
        handle = log.open("wb")
        if not self.suite.gpu and (argv[1:3] == ["-m", "hpcpipe"] or argv[1].endswith(".py")):
            return ForkedCommand(argv, REPO, self.env(env), handle), log  # it closes the log
        try:
            proc: Command = subprocess.Popen(
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

    def finish(self, proc: Command, log: Path, ok: Sequence[int] = (0,)) -> int:
        """Wait for ``proc`` until the deadline; StepFailed on a timeout or an exit code not in ``ok``."""
        started = time.monotonic()
        try:
            code = proc.wait(timeout=max(self.left(), 0.1))
        except subprocess.TimeoutExpired:
            stop(proc)
            self._count_forked(proc)
            self.commands[-1].update(rc=None, seconds=round(time.monotonic() - started, 1))
            waited = time.monotonic() - started
            raise StepFailed(
                f"timed out after {waited:.0f} s (the step's share of the budget): {_cmd(proc.args)}"
            ) from None
        self._count_forked(proc)
        self.commands[-1].update(rc=code, seconds=round(time.monotonic() - started, 1))
        if code not in ok:
            raise StepFailed(f"`{_cmd(proc.args)}` exited {code}: {last_line(log)}")
        return code

    def _count_forked(self, proc: Command) -> None:
        if isinstance(proc, ForkedCommand):
            self.forked_cpu_s += proc.cpu_s

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


def need_packages(*names: str, how: str = "pip install 'hpcpipe[lora]'") -> None:
    """StepSkipped naming the modules of ``names`` this interpreter cannot import."""
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        raise StepSkipped(f"needs {', '.join(missing)} ({how}, or bring the wheels)")


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
