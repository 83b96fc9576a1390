"""NVTX ranges (``observe/nvtx.py``): what a profiler attached to a training run records, and
what the ranges cost.

The profiler here is a real NVTX v3 tool: ``tests/data/nvtx/record_ranges.c``, built with gcc
into a shared library that the process loads through ``NVTX_INJECTION64_PATH``, exactly as Nsight
Systems injects its own. It logs every push and pop it receives to ``HPCPIPE_NVTX_LOG``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers import run_cli, tiny_job_sets

from hpcpipe.observe.nvtx import nvtx_ranges

pytestmark = pytest.mark.timeout(180)

TOOL_SOURCE = Path(__file__).resolve().parents[2] / "data" / "nvtx" / "record_ranges.c"
PHASES_OF_A_MICRO_STEP = ["data", "forward", "comm", "backward", "comm"]


@pytest.fixture(scope="module")
def nvtx_tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed: the NVTX test tool cannot be built")
    library = tmp_path_factory.mktemp("nvtx") / "librecord_ranges.so"
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(library), str(TOOL_SOURCE)],
        check=True,
        timeout=60,
    )
    return library


def _events(log: Path) -> list[tuple[str, ...]]:
    """("push", name[, payload]) and ("pop",) for hpcpipe's domain, in order."""
    events = []
    for line in log.read_text().splitlines():
        kind, domain, *rest = line.split(" ")
        if domain == "hpcpipe":
            events.append((kind, *rest))
    return events


def _nest(events: list[tuple[str, ...]]) -> list[tuple[str, list]]:
    """The pushes as a tree (name, children); asserts every pop closes an open range."""
    root: list[tuple[str, list]] = []
    stack = [root]
    for event in events:
        if event[0] == "push":
            node: tuple[str, list] = (" ".join(event[1:]), [])
            stack[-1].append(node)
            stack.append(node[1])
        else:
            assert len(stack) > 1, "a pop without a push"
            stack.pop()
    assert len(stack) == 1, f"{len(stack) - 1} range(s) left open"
    return root


def test_a_training_run_under_a_tool_emits_every_phase_and_region_as_a_range(
    tmp_path: Path, nvtx_tool: Path
) -> None:
    log = tmp_path / "ranges.log"
    sets = tiny_job_sets(tmp_path, "ranges", "train.steps=2", "checkpoint.every_steps=2")
    env = {"NVTX_INJECTION64_PATH": str(nvtx_tool), "HPCPIPE_NVTX_LOG": str(log)}
    proc = run_cli("train", "tiny", *sets, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    tree = _nest(_events(log))
    steps = [(name, children) for name, children in tree if name.startswith("step ")]
    assert [name for name, _ in steps] == ["step 1", "step 2"]  # the step number is the payload
    # The tiny preset takes two micro-batches per step (global 8 = 2 x micro 4).
    for _, children in steps:
        assert [name for name, _ in children] == [*PHASES_OF_A_MICRO_STEP * 2, "optimizer"]
        assert all(grandchildren == [] for _, grandchildren in children)  # phases never overlap
    outside = [name for name, _ in tree if not name.startswith("step ")]
    assert outside.count("all_reduce_metrics") == 2  # log_every=1: one per step, after it
    assert outside[-2:] == ["evaluate", "checkpoint_save"]  # the final evaluation, then the save
    assert [name for name, _ in tree].index("step 2") < len(tree) - 2


def test_without_a_tool_there_is_no_listener() -> None:
    # This process loaded no NVTX tool: the package hands out a dummy domain, and the loop gets
    # no listener at all, so the ranges cost nothing (the cost with a tool is measured below).
    assert nvtx_ranges() is None


def test_nvtx_disable_turns_the_ranges_off_under_a_tool_too(tmp_path: Path, nvtx_tool: Path) -> None:
    """The nvtx package honours NVTX_DISABLE in its module-level functions only: with a tool
    loaded, its get_domain still hands out a live domain. nvtx_ranges reads the variable itself."""
    log = tmp_path / "ranges.log"
    code = (
        "import nvtx\n"
        "from hpcpipe.observe.nvtx import DOMAIN, nvtx_ranges\n"
        "print(type(nvtx.get_domain(DOMAIN)).__name__, type(nvtx_ranges()).__name__)\n"
    )
    tool = {"NVTX_INJECTION64_PATH": str(nvtx_tool), "HPCPIPE_NVTX_LOG": str(log)}
    seen = {}
    for disable in ("1", ""):
        env = {**os.environ, **tool, "NVTX_DISABLE": disable}
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=False
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        seen[disable] = proc.stdout.split()[-1]
    assert seen == {"1": "NoneType", "": "NvtxRanges"}  # an empty value is unset, as for the package


COST = r"""
import json, statistics, sys, time
import torch
from hpcpipe.config import load_config
from hpcpipe.models.gpt import GPT
from hpcpipe.observe.nvtx import nvtx_ranges
from hpcpipe.observe.phases import PhaseTimer

torch.manual_seed(0)
torch.set_num_threads(1)
job = load_config("tiny", [])
model = GPT(job.model, 256)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
batches = [torch.randint(0, 256, (4, job.model.seq_len + 1)) for _ in range(2)]

def tiny_step():  # the tiny preset's step: two micro-batches of 4 x 32 tokens, AdamW
    for tokens in batches:
        logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

def boundaries(timer, steps):  # what the trainer tells the phase timer in one such step
    start = time.perf_counter()
    for step in range(1, steps + 1):
        timer.begin_step(step)
        for _ in range(2):
            for phase in ("data", "forward", "comm", "backward"):
                timer.begin(phase)
        timer.begin("optimizer")
        timer.end_step()
        if step % 64 == 0:
            timer.read()
    return (time.perf_counter() - start) / steps

listener = nvtx_ranges()
with_ranges, without = PhaseTimer(torch.device("cpu")), PhaseTimer(torch.device("cpu"))
with_ranges.listeners.append(listener)
cost = min(boundaries(with_ranges, 2000) - boundaries(without, 2000) for _ in range(7))
for _ in range(3):
    tiny_step()
times = []
for _ in range(15):
    start = time.perf_counter()
    tiny_step()
    times.append(time.perf_counter() - start)
print(json.dumps({"listener": type(listener).__name__, "cost_s": cost, "step_s": statistics.median(times)}))
"""


def test_ranges_cost_under_one_percent_of_a_tiny_step_even_with_a_tool_attached(
    tmp_path: Path, nvtx_tool: Path
) -> None:
    """With no profiler there is no listener (above). With a tool that records nothing attached,
    the listener's calls per step (the phase boundaries, timed in a tight loop, best of 7) must
    stay under 1% of the tiny preset's training step on one thread: an upper bound of what the
    ranges add to any real step."""
    env = {**os.environ, "NVTX_INJECTION64_PATH": str(nvtx_tool)}
    proc = subprocess.run(
        [sys.executable, "-c", COST], capture_output=True, text=True, timeout=150, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["listener"] == "NvtxRanges"  # the tool was attached: the ranges were live
    assert result["cost_s"] < 0.01 * result["step_s"], result
