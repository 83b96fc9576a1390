"""Preemption in one process: real signals, restored handlers, agreement arithmetic, grace timer.

The agreement across 2 ranks (only one signalled) is in tests/distributed/test_oom_agreement.py.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

import pytest
import torch

from hpcpipe.train import fault_injection as inject
from hpcpipe.train import preempt
from hpcpipe.train.preempt import PREEMPT_EXIT_CODE, Preempted, PreemptionHandler


def _previous(signum: int, frame: FrameType | None) -> None:
    """A stand-in for whatever handler was installed before (torchrun's, a user's)."""


@pytest.fixture
def handler() -> Iterator[PreemptionHandler]:
    before = {sig: signal.signal(sig, _previous) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    h = PreemptionHandler(grace_s=5)
    h.install()
    yield h
    h.cancel()
    h.uninstall()
    for sig, old in before.items():
        signal.signal(sig, old)
    inject.configure({})


def test_a_real_sigusr1_sets_the_flag_only(handler: PreemptionHandler) -> None:
    assert not handler.requested_locally()
    assert handler.should_stop(None) is False
    os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs before os.kill returns to Python code
    assert handler.requested_locally()
    assert handler.signum == signal.SIGUSR1
    assert handler.should_stop(None) is True
    row = handler.describe()
    assert (row["signal"], row["signalled_here"], row["exit_code"]) == ("SIGUSR1", True, PREEMPT_EXIT_CODE)
    assert 0 <= row["since_signal_s"] < 5


def test_sigterm_too_and_the_first_signal_is_kept(handler: PreemptionHandler) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    first = handler.received_at
    os.kill(os.getpid(), signal.SIGUSR1)
    assert handler.signum == signal.SIGTERM and handler.received_at == first


def test_a_preemption_after_ctrl_c_wins() -> None:
    """Ctrl-C first kept the interrupt (exit 130, no requeue) though the scheduler then preempted."""
    h = PreemptionHandler(grace_s=5)
    h._on_signal(signal.SIGINT, None)
    first = h.received_at
    h._on_signal(signal.SIGTERM, None)
    assert h.should_stop(None) and not h.interrupted and h.stop_exit_code == PREEMPT_EXIT_CODE
    assert h.received_at == first
    h._on_signal(signal.SIGINT, None)  # and stays
    assert h.signum == signal.SIGTERM


def test_uninstall_restores_the_previous_handlers(handler: PreemptionHandler) -> None:
    assert signal.getsignal(signal.SIGTERM) == handler._on_signal
    handler.install()  # twice: must not record its own handler as "previous"
    handler.uninstall()
    assert signal.getsignal(signal.SIGTERM) is _previous
    assert signal.getsignal(signal.SIGUSR1) is _previous


def test_install_outside_the_main_thread_is_refused() -> None:
    errors: list[BaseException] = []

    def install() -> None:
        try:
            PreemptionHandler(grace_s=1).install()
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=install)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "main thread" in str(errors[0])


class FakeGroup:
    """An all-reduce MAX over this rank and others whose flags the test sets."""

    def __init__(self) -> None:
        self.others = 0
        self.sent: list[torch.Tensor] = []

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        self.sent.append(tensor.clone())
        return torch.maximum(tensor, torch.tensor([self.others]))


def test_a_signal_on_another_rank_stops_this_one() -> None:
    h, group = PreemptionHandler(grace_s=1), FakeGroup()
    assert h.should_stop(group) is False
    group.others = 2  # a preemption signal on another rank
    assert h.should_stop(group) is True
    assert not h.requested_locally() and not h.interrupted and h.stop_exit_code == 75
    assert [(t.dtype, t.tolist()) for t in group.sent] == [(torch.int64, [0])] * 2
    assert h.should_stop(group) is True and len(group.sent) == 2  # decided: no more collectives


def test_check_every_skips_the_collective_between_checks() -> None:
    h, group = PreemptionHandler(grace_s=1, check_every=3), FakeGroup()
    h.signum = signal.SIGTERM  # as the handler would set it
    results = [h.should_stop(group) for _ in range(4)]
    assert results == [False, False, True, True]
    assert len(group.sent) == 1 and group.sent[0].tolist() == [2]  # 2: a preemption
    with pytest.raises(ValueError, match="check_every"):
        PreemptionHandler(grace_s=1, check_every=0)


def test_grace_timer_fires_and_cancel_stops_it() -> None:
    h = PreemptionHandler(grace_s=0.1)
    fired = threading.Event()
    h.start_grace_timer(fired.set)
    assert fired.wait(2)
    cancelled = threading.Event()
    h2 = PreemptionHandler(grace_s=0.2)
    h2.start_grace_timer(cancelled.set)
    h2.cancel()
    assert not cancelled.wait(0.5)


def test_grace_counts_from_the_signal() -> None:
    h = PreemptionHandler(grace_s=3)
    h.signum, h.received_at = signal.SIGTERM, time.monotonic() - 2.9  # signalled 2.9 s ago
    fired = threading.Event()
    t0 = time.monotonic()
    h.start_grace_timer(fired.set)
    assert fired.wait(2)
    assert time.monotonic() - t0 < 1


def test_default_expiry_exits_with_the_preemption_code(monkeypatch: pytest.MonkeyPatch) -> None:
    codes: list[int] = []
    done = threading.Event()

    def fake_exit(code: int) -> None:
        codes.append(code)
        done.set()

    monkeypatch.setattr(preempt.os, "_exit", fake_exit)
    PreemptionHandler(grace_s=0.05).start_grace_timer()
    assert done.wait(2)
    assert codes == [75]


def test_chaos_sigterm_signals_the_matching_rank_only(handler: PreemptionHandler) -> None:
    inject.configure({"HPCPIPE_CHAOS_SIGTERM": "step=6,rank=0,signal=USR1"})
    inject.maybe_inject(6, rank=1)
    inject.maybe_inject(5, rank=0)
    assert not handler.requested_locally()
    inject.maybe_inject(6, rank=0)
    assert handler.signum == signal.SIGUSR1


def test_preempted_is_not_swallowed_by_except_exception() -> None:
    with pytest.raises(Preempted) as err:
        try:
            raise Preempted(step=12)
        except Exception:  # a handler on the way up that is meant for errors
            pytest.fail("Preempted must not be an Exception")
    assert (err.value.step, err.value.exit_code) == (12, PREEMPT_EXIT_CODE)
    assert "checkpointed at step 12" in str(err.value)


def test_ctrl_c_agrees_on_an_interrupt_unless_a_rank_is_preempted() -> None:
    """SIGINT: exit 130, checkpoint only where configured; a preemption anywhere wins (75)."""
    interrupted, group = PreemptionHandler(grace_s=1), FakeGroup()
    interrupted._on_signal(signal.SIGINT, None)
    group.others = 1  # the other rank saw Ctrl-C too
    assert interrupted.should_stop(group) and interrupted.interrupted
    assert interrupted.stop_exit_code == 130 and interrupted.describe()["exit_code"] == 130
    preempted, group = PreemptionHandler(grace_s=1), FakeGroup()
    preempted._on_signal(signal.SIGINT, None)
    group.others = 2  # ... while another rank is being preempted: everyone checkpoints, exits 75
    assert preempted.should_stop(group) and not preempted.interrupted and preempted.stop_exit_code == 75
    alone = PreemptionHandler(grace_s=1)
    alone._on_signal(signal.SIGINT, None)
    assert alone.should_stop(None) and alone.stop_exit_code == 130  # one process: no collective
    assert "interrupted: stopped at step 3, no checkpoint" in str(Preempted(3, 130, checkpointed=False))


def test_an_agreement_that_carries_the_flag_spares_the_step_its_own() -> None:
    """The OOM guard's per-micro-step agreement carries the signal level: should_stop then
    decides from it (every rank saw the same MAX) and sends nothing; without one, it sends its own."""
    h, group = PreemptionHandler(grace_s=1), FakeGroup()
    carried = h.carried_by(group)
    assert carried(torch.tensor([0])).tolist() == [0]  # the guard's own answer comes back unchanged
    assert group.sent[-1].tolist() == [0, 0]  # its flag, then this rank's signal level
    assert h.should_stop(group) is False and len(group.sent) == 1  # decided by the carried one
    assert h.should_stop(group) is False and len(group.sent) == 2  # none carried: its own
    group.others = 2  # another rank is preempted before the next step's agreement
    assert carried(torch.tensor([1])).tolist() == [2]  # MAX of (1, 2) for the guard too
    assert h.should_stop(group) is True and len(group.sent) == 3 and h.stop_exit_code == 75


def test_checked_every_agrees_on_every_nth_call_only() -> None:
    """An evaluation checks every few batches: the same calls on every rank, one collective each."""
    handler = PreemptionHandler(grace_s=10)
    reduced: list[int] = []

    def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
        reduced.append(int(tensor.max()))
        return tensor

    check = handler.checked_every(3, all_reduce_max)
    assert [check() for _ in range(6)] == [False] * 6 and len(reduced) == 2
    handler._on_signal(signal.SIGTERM, None)
    assert [check(), check(), check()] == [False, False, True] and len(reduced) == 3
    alone = PreemptionHandler(grace_s=10).checked_every(3, None)  # one process: every call, free
    assert alone() is False
