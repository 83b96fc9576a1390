"""OOM recovery in one process: classification, the shrink rule, the protocol, chaos injection.

The cross-rank agreement under DDP and FSDP2 is in tests/distributed/test_oom_agreement.py.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hpcpipe.chaos import ChaosConfigError
from hpcpipe.errors import ConfigError, UserError
from hpcpipe.train import fault_injection as inject
from hpcpipe.train.oom import OOMGuard, OOMNotRecoverable, SimulatedOOM, is_oom

# -- classification ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (torch.cuda.OutOfMemoryError("CUDA out of memory"), True),
        (SimulatedOOM("chaos"), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"), True),
        (
            RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"),
            True,
        ),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"), False),
        (ValueError("out of memory"), False),  # not an allocator error type
        (MemoryError(), False),  # host exhaustion: the OOM killer, not a smaller micro-batch
        (OOMNotRecoverable("out of memory in the backward ..."), False),  # already escalated
    ],
)
def test_is_oom(exc: BaseException, expected: bool) -> None:
    assert is_oom(exc) is expected


def test_simulated_oom_is_caught_like_a_cuda_oom() -> None:
    with pytest.raises(torch.cuda.OutOfMemoryError):
        raise SimulatedOOM("chaos")


# -- the shrink rule -----------------------------------------------------------------------------


def test_shrink_halves_micro_and_doubles_accumulation_down_to_one() -> None:
    guard = OOMGuard(micro_batch_size=8, accum_steps=2)
    assert [guard.shrink() for _ in range(3)] == [(4, 4), (2, 8), (1, 16)]
    with pytest.raises(ConfigError, match=r"train\.micro_batch_size: .* micro-batch of 1, which cannot"):
        guard.shrink()
    assert (guard.micro_batch_size, guard.accum_steps) == (1, 16)  # unchanged by the failure


def test_an_odd_micro_batch_is_not_halved() -> None:
    guard = OOMGuard(micro_batch_size=6, accum_steps=1)
    assert guard.shrink() == (3, 2)
    with pytest.raises(
        ConfigError, match=r"train\.micro_batch_size: .* micro-batch of 3, which is odd"
    ) as err:
        guard.shrink()
    assert isinstance(err.value, UserError)  # one line and exit code 2 in the CLI
    assert (guard.micro_batch_size, guard.accum_steps) == (3, 2)


def test_rejects_an_empty_split() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        OOMGuard(micro_batch_size=0, accum_steps=2)


def test_state_dict_round_trip_and_mismatch() -> None:
    shrunk = OOMGuard(4, 2)
    shrunk.shrink()
    resumed = OOMGuard(4, 2)
    assert resumed.load_state_dict(shrunk.state_dict())
    assert (resumed.micro_batch_size, resumed.accum_steps) == (2, 4)
    before_the_config_was_recorded = {"micro_batch_size": 2, "accum_steps": 4}
    assert OOMGuard(8, 1).load_state_dict(before_the_config_was_recorded)
    with pytest.raises(ConfigError, match=r"train\.micro_batch_size: the checkpoint's split 2 x 4"):
        OOMGuard(4, 4).load_state_dict(before_the_config_was_recorded)


def test_a_changed_micro_batch_size_wins_over_the_checkpoints_split() -> None:
    """The user lowered train.micro_batch_size after an OOM (same global batch): the checkpoint's
    split, 4 x 2 as configured then, must not bring the larger micro-batch back."""
    saved = OOMGuard(4, 2).state_dict()
    lowered = OOMGuard(2, 4)
    assert not lowered.load_state_dict(saved)
    assert (lowered.micro_batch_size, lowered.accum_steps) == (2, 4)
    shrunk = OOMGuard(8, 1)
    shrunk.shrink()  # 4 x 2, configured 8 x 1
    assert not lowered.load_state_dict(shrunk.state_dict())
    assert (lowered.micro_batch_size, lowered.accum_steps) == (2, 4)
    raised_batch = OOMGuard(4, 4)  # a larger global batch: this run's split, not the saved one
    assert not raised_batch.load_state_dict(saved)
    assert (raised_batch.micro_batch_size, raised_batch.accum_steps) == (4, 4)


def test_agree_reports_the_highest_oom_rank() -> None:
    guard = OOMGuard(2, 2, rank=0)
    sent: list[torch.Tensor] = []

    def others_oomed(t: torch.Tensor) -> torch.Tensor:  # rank 2 of the group ran out of memory
        sent.append(t.clone())
        return torch.maximum(t, torch.tensor([3]))

    assert guard.agree(False, others_oomed) is True
    assert guard.oom_rank == 2
    assert sent[0].dtype == torch.int64 and sent[0].tolist() == [0]
    assert guard.agree(True, None) is True and guard.oom_rank == 0
    assert guard.agree(False, None) is False and guard.oom_rank is None


# -- the protocol in one process -----------------------------------------------------------------


class ListLoader:
    """The trainer's loader semantics: moves to the next step by itself after the last micro-batch."""

    def __init__(self, per_step: int, micro: int) -> None:
        gen = torch.Generator().manual_seed(3)
        self.x, self.y = torch.randn(64, 3, generator=gen), torch.randn(64, 1, generator=gen)
        self.per_step, self.micro = per_step, micro
        self.step = self.offset = 0

    def next_microbatch(self) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.step * self.per_step + self.offset
        self.offset += self.micro
        if self.offset == self.per_step:
            self.step, self.offset = self.step + 1, 0
        return self.x[first : first + self.micro], self.y[first : first + self.micro]

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.offset = state["step"], state["offset"]

    def set_micro_batch_size(self, micro: int) -> None:
        self.micro = micro


def _forward(
    model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], accum: int, at: tuple[int, int]
) -> torch.Tensor:
    loss = F.mse_loss(model(batch[0]), batch[1]) / accum
    inject.maybe_inject(at[0], 0, at[1], "forward")
    return loss


def _backward(at: tuple[int, int], loss: torch.Tensor) -> None:
    inject.maybe_inject(at[0], 0, at[1], "backward")
    loss.backward()


def train(chaos: dict[str, str], steps: int = 3, enabled: bool = True) -> tuple[nn.Linear, OOMGuard]:
    """A tiny model trained with the trainer's protocol (see hpcpipe.train.oom)."""
    inject.configure(chaos)
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    guard = OOMGuard(micro_batch_size=4, accum_steps=2, enabled=enabled)
    guard.attach(model)
    loader = ListLoader(per_step=8, micro=4)
    for step in range(1, steps + 1):
        snapshot = loader.state_dict()
        while True:
            for micro in range(guard.accum_steps):
                forward = functools.partial(
                    _forward, model, loader.next_microbatch(), guard.accum_steps, (step, micro)
                )
                backward = functools.partial(_backward, (step, micro))
                final = micro == guard.accum_steps - 1
                loss = guard.micro_step(
                    forward, backward, final=final, all_reduce_max=None, step=step, micro=micro
                )
                if loss is None:
                    break
            else:
                opt.step()
                opt.zero_grad(set_to_none=True)
                break
            guard.recover(step, opt, loader, snapshot)
    return model, guard


@pytest.fixture(autouse=True)
def _no_chaos() -> Any:
    yield
    inject.configure({})


@pytest.mark.parametrize(
    "spec",
    [
        "step=2,micro=0",  # forward of the first micro-step
        "step=2,micro=1",  # forward of the last one: the loader already moved to step 3
        "step=3,micro=1,where=backward",  # a single process's backward is collective-free
    ],
)
def test_recovered_training_matches_the_run_without_oom(spec: str) -> None:
    reference, _ = train({})
    recovered, guard = train({"HPCPIPE_CHAOS_OOM": spec})
    for ref, got in zip(reference.parameters(), recovered.parameters(), strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    assert not torch.equal(reference.weight, nn.Linear(3, 1).weight)
    fields = dict(kv.split("=") for kv in spec.split(","))
    assert guard.events == [
        {
            "step": int(fields["step"]),
            "micro_step": int(fields["micro"]),
            "rank": 0,
            "strategy": "single",
            "old_micro_batch_size": 4,
            "old_accum_steps": 2,
            "new_micro_batch_size": 2,
            "new_accum_steps": 4,
        }
    ]
    assert (guard.micro_batch_size, guard.accum_steps) == (2, 4)  # it does not grow back


def test_disabled_guard_lets_the_oom_through() -> None:
    with pytest.raises(SimulatedOOM):
        train({"HPCPIPE_CHAOS_OOM": "step=1,micro=0"}, enabled=False)


def test_other_errors_pass_through_untouched() -> None:
    guard = OOMGuard(2, 1)
    guard.attach(nn.Linear(1, 1))

    def broken() -> torch.Tensor:
        raise ValueError("a bug, not an OOM")

    with pytest.raises(ValueError, match="a bug"):
        guard.micro_step(broken, lambda loss: None, final=True, all_reduce_max=None, step=1, micro=0)


def test_micro_step_needs_attach() -> None:
    with pytest.raises(RuntimeError, match=r"attach\(model\)"):
        OOMGuard(2, 1).micro_step(
            torch.zeros, lambda loss: None, final=True, all_reduce_max=None, step=1, micro=0
        )


# -- chaos injection (the OOM site; the others are in test_preempt.py and test_watchdog.py) -----


def test_chaos_spec_parsing() -> None:
    faults, marker_dir = inject.parse_faults(
        {"HPCPIPE_CHAOS_OOM": " step=5, rank=1, micro=2 ", "HPCPIPE_CHAOS_SIGTERM": "step=6,signal=USR1"}
    )
    assert marker_dir is None
    oom, sig = faults
    assert (oom.kind, oom.step, oom.rank, oom.micro, oom.where) == ("OOM", 5, 1, 2, "forward")
    assert (sig.kind, sig.step, sig.rank, sig.signum) == ("SIGTERM", 6, None, inject.signal.SIGUSR1)
    assert inject.parse_faults({}) == ((), None)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HPCPIPE_CHAOS_OOM": "5"}, r"HPCPIPE_CHAOS_OOM: expected key=value pairs"),
        ({"HPCPIPE_CHAOS_OOM": "rank=1"}, r"HPCPIPE_CHAOS_OOM: 'step' is required"),
        ({"HPCPIPE_CHAOS_HANG": "step=x"}, r"HPCPIPE_CHAOS_HANG: step='x' is not an integer"),
        ({"HPCPIPE_CHAOS_HANG": "step=-1"}, r"HPCPIPE_CHAOS_HANG: step=-1 must be >= 0"),
        ({"HPCPIPE_CHAOS_OOM": "step=1,rnak=1"}, r"HPCPIPE_CHAOS_OOM: unknown key 'rnak'"),
        ({"HPCPIPE_CHAOS_OOM": "step=1,signal=USR1"}, r"HPCPIPE_CHAOS_OOM: unknown key 'signal'"),
        ({"HPCPIPE_CHAOS_OOM": "step=1,where=loss"}, r"HPCPIPE_CHAOS_OOM: where='loss' is not one of"),
        ({"HPCPIPE_CHAOS_SIGTERM": "step=1,signal=HUP"}, r"HPCPIPE_CHAOS_SIGTERM: signal='HUP'"),
        ({"HPCPIPE_CHAOS_KILL": "step=1"}, r"HPCPIPE_CHAOS_KILL needs HPCPIPE_CHAOS_DIR"),
    ],
)
def test_chaos_parse_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ChaosConfigError, match=message):
        inject.parse_faults(env)


def test_chaos_oom_fires_once_at_its_point_only() -> None:
    inject.configure({"HPCPIPE_CHAOS_OOM": "step=5,rank=1,micro=2"})
    assert inject.active()
    for step, rank, micro, where in [
        (5, 0, 2, "forward"),
        (4, 1, 2, "forward"),
        (5, 1, 1, "forward"),
        (5, 1, 2, "backward"),
    ]:
        inject.maybe_inject(step, rank, micro, where)  # no match: nothing happens
    with pytest.raises(SimulatedOOM, match="out of memory at step 5, micro-step 2"):
        inject.maybe_inject(5, 1, 2)
    inject.maybe_inject(5, 1, 2)  # the retried step must not run out of memory again


def test_chaos_marker_directory_survives_a_restart(tmp_path: Path) -> None:
    env = {"HPCPIPE_CHAOS_OOM": "step=1", "HPCPIPE_CHAOS_DIR": str(tmp_path / "markers")}
    inject.configure(env)
    with pytest.raises(SimulatedOOM):
        inject.maybe_inject(1, 0)
    inject.configure(env)  # a restarted worker: same environment, fresh process state
    inject.maybe_inject(1, 0)
    with pytest.raises(SimulatedOOM):
        inject.maybe_inject(1, 1)  # rank=* : each rank has its own marker
    assert sorted(p.name for p in (tmp_path / "markers").iterdir()) == [
        "oom-rank0-step1.fired",
        "oom-rank1-step1.fired",
    ]


def test_chaos_parse_error_at_import_is_one_line() -> None:
    env = {**os.environ, "HPCPIPE_CHAOS_HANG": "step=four"}
    code = "import hpcpipe.chaos"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "ChaosConfigError: HPCPIPE_CHAOS_HANG: step='four' is not an integer" in proc.stderr


def test_a_backward_oom_fires_in_the_trainers_loop_and_is_recovered(tmp_path: Path) -> None:
    """``where=backward`` is a documented site: the trainer itself reaches it (it used to reach
    only ``forward``, so the fault was accepted and never fired)."""
    import json

    from tests.helpers import run_cli

    env = {"HPCPIPE_CHAOS_OOM": "step=2,micro=0,where=backward"}
    sets = ["--set", f"run.out_dir={tmp_path}", "--set", "train.steps=3", "--set", "observe.progress=false"]
    proc = run_cli("train", "tiny", *sets, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [json.loads(line) for line in (tmp_path / "tiny" / "events.jsonl").read_text().splitlines()]
    recovered = [e for e in events if e["event"] == "oom_recovered"]
    assert [(e["step"], e["micro_step"], e["new_micro_batch_size"]) for e in recovered] == [(2, 0, 2)]


COUNTING_RECIPE = '''
import torch
from hpcpipe.recipes.gpt import GPTRecipe


class CountingGPT(GPTRecipe):
    """The gpt recipe counting its training rows, as lora-function-calling counts supervised tokens."""

    def loss(self, model, batch):
        if model.training:  # the gpt recipe's evaluation calls loss too
            rows = torch.tensor(float(batch[0].shape[0]))
            self.rows = self.__dict__.get("rows", torch.tensor(0.0)) + rows
        return super().loss(model, batch)

    def interval_counts(self):
        counts = {"rows": self.__dict__.pop("rows")} if "rows" in self.__dict__ else {}
        return counts
'''


def test_a_recipes_counts_leave_out_the_attempt_an_oom_cut_short(tmp_path: Path) -> None:
    """The counts of a step's attempt that ran out of memory were logged with those of its retry:
    lora-function-calling's supervised tokens per second rose by half at a recovered OOM."""
    import json

    from tests.helpers import run_cli

    (tmp_path / "counting_recipe.py").write_text(COUNTING_RECIPE)
    env = {"HPCPIPE_CHAOS_OOM": "step=2,micro=0,where=backward", "PYTHONPATH": str(tmp_path)}
    sets = [f"run.out_dir={tmp_path}", "run.recipe=counting_recipe:CountingGPT", "train.steps=3"]
    sets += ["observe.progress=false", "observe.log_every=1"]
    proc = run_cli("train", "tiny", *(a for s in sets for a in ("--set", s)), cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "tiny" / "metrics.jsonl").read_text().splitlines()]
    counted = [r["rows_per_s_per_device"] * r["step_time_s"] for r in rows if "loss" in r]
    assert counted == pytest.approx([8.0, 8.0, 8.0])  # global batch 8 on one rank, every step
