"""OOM recovery and preemption agreed across 2 gloo ranks, under DDP and FSDP2.

Only one rank runs out of memory (a simulated OOM from ``hpcpipe.chaos``) or receives the
signal; both must take the same decision at the same point. The recovered runs must end with
the parameters of a run without OOM: the global batch, the data order and the update are the
same; only the split into micro-batches differs, i.e. the order of a few float32 additions
(hence 1e-6, not equality).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tests.helpers import start_ranks
from torch import nn

from hpcpipe.observe.watchdog import Watchdog
from hpcpipe.train import fault_injection as inject
from hpcpipe.train.oom import OOMGuard, OOMNotRecoverable, SimulatedOOM, max_over_ranks
from hpcpipe.train.parallel import gradient_sync
from hpcpipe.train.preempt import PreemptionHandler

WORLD = 2
STEPS = 4
GLOBAL_BATCH = 8  # 4 samples per rank: micro 2 x accum 2, shrinking to 1 x 4
TOLERANCE = 1e-6
HANG_TIMEOUT_S = 60  # a worker runs for a few seconds; a deadlock is a failure, not a CI timeout

# scenario -> HPCPIPE_CHAOS_OOM (empty: the reference run). Step numbers start at 1.
RECOVERABLE = {
    "reference": "",
    "forward_first_micro": "step=2,rank=1,micro=0",
    # The last micro-step's forward synchronises; the OOM hits inside the model (before the head),
    # so DDP's reducer is armed on rank 0 only and must be reset, and FSDP2 must drop the
    # gradients accumulated by micro-step 0.
    "head_last_micro": "step=2,rank=1,micro=1",
    "head_late_step": "step=4,rank=0,micro=0",
}
INSIDE_MODEL = {"head_last_micro", "head_late_step"}  # else: at the end of the forward (after the loss)
DDP_ONLY = {"backward_first_micro": "step=3,rank=1,micro=0,where=backward"}  # no_sync: collective-free
At = tuple[int, int, int]  # step, rank, micro-step
CURRENT: dict[str, Any] = {"at": (0, 0, 0), "inside": False}  # where the worker is, for Tiny.forward


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


class Tiny(nn.Module):
    """Two shardable blocks and a buffer (so DDP broadcasts buffers in every forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([Block(8), Block(8)])
        self.out = nn.Linear(8, 1)
        self.register_buffer("gain", torch.full((8,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 4) -> (B, 1)
        h = self.inp(x) * self.gain
        for block in self.blocks:
            h = block(h)
        if CURRENT["inside"]:  # after the last block's all-gather: recoverable under FSDP2 too
            step, rank, micro = CURRENT["at"]
            inject.maybe_inject(step, rank, micro, "forward")
        return self.out(h)


class ArrayLoader:
    """A rank-sharded loader with the trainer's loader semantics (state, micro-batch change)."""

    def __init__(self, micro: int, rank: int) -> None:
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(GLOBAL_BATCH * (STEPS + 1), 4, generator=gen)
        self.y = torch.randn(GLOBAL_BATCH * (STEPS + 1), 1, generator=gen)
        self.micro, self.rank, self.per_rank = micro, rank, GLOBAL_BATCH // WORLD
        self.step = self.offset = 0

    def next_microbatch(self) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.step * GLOBAL_BATCH + self.rank * self.per_rank + self.offset
        batch = self.x[first : first + self.micro], self.y[first : first + self.micro]
        self.offset += self.micro
        if self.offset == self.per_rank:
            self.step, self.offset = self.step + 1, 0
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.offset = state["step"], state["offset"]

    def set_micro_batch_size(self, micro: int) -> None:
        assert self.per_rank % micro == 0 and self.offset == 0
        self.micro = micro


def _forward(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], accum: int, at: At) -> torch.Tensor:
    x, y = batch
    CURRENT["at"] = at
    loss = F.mse_loss(model(x), y) / accum
    if not CURRENT["inside"]:
        inject.maybe_inject(*at, "forward")  # the end of the forward: after every collective
    return loss


def _backward(at: At, loss: torch.Tensor) -> None:
    inject.maybe_inject(*at, "backward")
    loss.backward()


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, loader: ArrayLoader, guard: OOMGuard, step: int, rank: int
) -> None:
    """The protocol the trainer follows (see hpcpipe.train.oom): retry the step until it fits."""
    snapshot = loader.state_dict()
    agree = max_over_ranks()
    while True:
        for micro in range(guard.accum_steps):
            final = micro == guard.accum_steps - 1
            at = (step, rank, micro)
            forward = functools.partial(_forward, model, loader.next_microbatch(), guard.accum_steps, at)
            with gradient_sync(model, enabled=final):
                loss = guard.micro_step(
                    forward,
                    functools.partial(_backward, at),
                    final=final,
                    all_reduce_max=agree,
                    step=step,
                    micro=micro,
                )
            if loss is None:
                break
        else:
            opt.step()
            opt.zero_grad(set_to_none=True)
            return
        guard.recover(step, opt, loader, snapshot)


def build(strategy: str) -> tuple[nn.Module, list[nn.Module]]:
    torch.manual_seed(0)
    model = Tiny()
    units: list[nn.Module] = list(model.blocks)
    if strategy == "ddp":
        return nn.parallel.DistributedDataParallel(model), units
    from torch.distributed.fsdp import fully_shard

    for unit in units:
        fully_shard(unit)
    fully_shard(model)
    return model, units


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded parameters and buffers under the plain module's names."""
    state = model.state_dict()
    return {
        k.removeprefix("module."): (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
        for k, v in state.items()
    }


def run_scenario(
    strategy: str, rank: int, chaos: str
) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    inject.configure({"HPCPIPE_CHAOS_OOM": chaos})
    model, units = build(strategy)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    guard = OOMGuard(micro_batch_size=2, accum_steps=2, rank=rank)
    guard.attach(model, units)
    loader = ArrayLoader(micro=2, rank=rank)
    for step in range(1, STEPS + 1):
        train_step(model, opt, loader, guard, step, rank)
    return full_state(model), guard.events


def escalates(strategy: str, rank: int, how: str) -> bool:
    """Both ranks OOM at the same unrecoverable point: each must raise OOMNotRecoverable."""
    inject.configure({"HPCPIPE_CHAOS_OOM": "step=1,micro=1,where=backward" if how == "backward" else ""})
    model, units = build(strategy)
    if how == "before_fence":  # inside the sharded model / before DDP's pre-forward collectives
        target = units[0] if strategy == "fsdp" else model

        def oom_hook(module: nn.Module, args: Any) -> None:
            raise SimulatedOOM("simulated CUDA out of memory before the fence")

        target.register_forward_pre_hook(oom_hook)
    guard = OOMGuard(micro_batch_size=2, accum_steps=2, rank=rank)
    guard.attach(model, units)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        train_step(model, opt, ArrayLoader(micro=2, rank=rank), guard, 1, rank)
    except OOMNotRecoverable:
        return True
    return False


def oom_worker(rank: int, strategy: str, store: str, out: str) -> None:
    Watchdog(HANG_TIMEOUT_S, Path(out), rank).start()  # a hang fails fast, with stacks
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    scenarios = {**RECOVERABLE, **(DDP_ONLY if strategy == "ddp" else {})}
    result: dict[str, Any] = {"events": {}, "escalated": {}}
    for name, chaos in scenarios.items():
        CURRENT["inside"] = name in INSIDE_MODEL
        params, events = run_scenario(strategy, rank, chaos)
        torch.save(params, Path(out) / f"{name}-rank{rank}.pt")
        result["events"][name] = events
    # Last: an escalated step leaves the model mid-iteration on purpose.
    CURRENT["inside"] = False
    for how in ("before_fence", "backward"):
        result["escalated"][how] = escalates(strategy, rank, how)
    (Path(out) / f"result-rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def build_initial_inp_weight() -> torch.Tensor:
    torch.manual_seed(0)
    return Tiny().inp.weight.detach()


def spawn(fn: Callable[..., None], out: Path, *args: Any) -> None:
    """Run ``fn(rank, *args, out)`` on every rank; a failure shows the watchdog's stack dumps."""
    try:
        start_ranks(fn, (*args, str(out)), WORLD)
    except Exception:
        for dump in sorted(out.glob("hang-rank*.txt")):
            print(dump.read_text(), file=sys.stderr)
        raise


@pytest.mark.distributed
@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_one_rank_oom_is_agreed_and_recovered_exactly(strategy: str, tmp_path: Path) -> None:
    spawn(oom_worker, tmp_path, strategy, str(tmp_path / "store"))
    reference = torch.load(tmp_path / "reference-rank0.pt", weights_only=True)
    results = [json.loads((tmp_path / f"result-rank{r}.json").read_text()) for r in range(WORLD)]
    names = [n for n in results[0]["events"] if n != "reference"]
    assert len(names) == (4 if strategy == "ddp" else 3)
    for name in names:
        for rank in range(WORLD):
            params = torch.load(tmp_path / f"{name}-rank{rank}.pt", weights_only=True)
            for key, value in reference.items():
                assert torch.allclose(params[key], value, rtol=0, atol=TOLERANCE), (name, rank, key)
            assert not torch.equal(params["inp.weight"], build_initial_inp_weight())  # it trained
            (event,) = results[rank]["events"][name]  # every rank recovered exactly once
            chaos = dict(kv.split("=") for kv in {**RECOVERABLE, **DDP_ONLY}[name].split(","))
            assert event["step"] == int(chaos["step"])
            assert event["rank"] == int(chaos["rank"])
            assert event["micro_step"] == int(chaos["micro"])
            assert (event["old_micro_batch_size"], event["old_accum_steps"]) == (2, 2)
            assert (event["new_micro_batch_size"], event["new_accum_steps"]) == (1, 4)
            assert event["strategy"] == strategy
    assert results[0]["events"]["reference"] == []
    for rank in range(WORLD):
        assert results[rank]["escalated"] == {"before_fence": True, "backward": True}


def preempt_worker(rank: int, store: str, out: str) -> None:
    """Only rank 0 is signalled (SIGUSR1 at step 3); both must stop at the same boundary."""
    Watchdog(HANG_TIMEOUT_S, Path(out), rank).start()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    agree = max_over_ranks()
    stops = {}
    for check_every in (1, 2):
        inject.configure({"HPCPIPE_CHAOS_SIGTERM": "step=3,rank=0,signal=USR1"})
        handler = PreemptionHandler(grace_s=30, check_every=check_every)
        handler.install()
        stopped_at = None
        for step in range(1, 9):
            work = torch.ones(1)
            dist.all_reduce(work)  # the training step's own collectives
            inject.maybe_inject(step, rank, 0, "forward")
            if handler.should_stop(agree):
                stopped_at = step
                break
        handler.uninstall()
        stops[check_every] = {"step": stopped_at, "local": handler.requested_locally(), **handler.describe()}
        stops[check_every].pop("since_signal_s")
    (Path(out) / f"preempt-rank{rank}.json").write_text(json.dumps(stops))
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_one_signalled_rank_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    spawn(preempt_worker, tmp_path, str(tmp_path / "store"))
    stops = [json.loads((tmp_path / f"preempt-rank{r}.json").read_text()) for r in range(WORLD)]
    for rank, by_check in enumerate(stops):
        assert by_check["1"]["step"] == 3  # the boundary right after the signal
        assert by_check["2"]["step"] == 4  # the next checked boundary
        for row in by_check.values():
            assert row["local"] is (rank == 0)
            assert row["signal"] == ("SIGUSR1" if rank == 0 else None)
            assert row["exit_code"] == 75


def _events(run: Path, kind: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    return [row for row in rows if row["event"] == kind]


@pytest.mark.timeout(180)
def test_an_oom_in_ddp_s_last_backward_restarts_with_half_the_micro_batch(tmp_path: Path) -> None:
    """No in-process agreement is possible there (the gradient all-reduce is in flight): the
    agent's restart resumed with the checkpoint's split and ran out of memory again on every
    restart until --max-restarts was spent."""
    from tests.helpers import run_cli

    env = {
        "HPCPIPE_CHAOS_OOM": "step=4,rank=1,micro=0,where=backward",
        "HPCPIPE_CHAOS_DIR": str(tmp_path / "c"),
    }
    sets = ["parallel.strategy=ddp", "checkpoint.every_steps=2", "train.steps=6", f"run.out_dir={tmp_path}"]
    args = ["train", "tiny", "--nproc", "2", "--max-restarts", "1", *(a for s in sets for a in ("--set", s))]
    proc = run_cli(*args, env=env, cwd=tmp_path, timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "tiny"
    [taken] = _events(run, "oom_restart_split")
    assert (taken["step"], taken["old_micro_batch_size"], taken["new_micro_batch_size"]) == (2, 4, 2)
    assert _events(run, "resumed")[-1]["micro_batch_size"] == 4  # the checkpoint's, before the halving
    assert not (run / "oom_restart_split.json").exists()
