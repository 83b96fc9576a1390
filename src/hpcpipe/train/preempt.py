"""Preemption: SIGTERM / SIGUSR1 make every rank checkpoint at the next step boundary and exit.

Ctrl-C (SIGINT) stops the same orderly way, exits 130, and checkpoints only where the job
checkpoints (``checkpoint.every_steps`` > 0): a person asked, not a scheduler.

Slurm sends SIGTERM before killing a preempted or timed-out job (``KillWait`` seconds ahead), or
the signal named by ``sbatch --signal=USR1@<seconds>``; Kubernetes sends SIGTERM and waits
``terminationGracePeriodSeconds``; torchrun's agent forwards the signals it receives. Often only
some ranks receive the signal (one node is preempted, or the signal reaches one process), so
the decision is agreed on: each rank contributes its local flag to an all-reduce (MAX) at the
step boundary, and every rank stops at the same step even if only one was signalled.

The protocol the trainer follows:

1. ``handler.install()`` once, in the main thread, before the loop (``uninstall()`` at the end).
2. After each optimizer step: ``if handler.should_stop(all_reduce_max): ...``; inside an
   evaluation, every few batches (``checked_every``), so that a long one does not outlast the
   grace period. Every rank must
   call it at every step boundary (it is a collective on the steps it checks). A step whose
   collectives already include an agreement (the OOM guard's, one per micro-step) carries the
   signal in it (``carried_by``): ``should_stop`` then reads what that agreement decided and
   communicates nothing. Two synchronisations per step would otherwise cost a DDP step of 60 ms
   about 3% each on a 2-core CPU (measured with ``benchmarks/example_recipe_overhead.py``); a
   signal that arrives after the step's last agreement is seen one step later.
3. Stopping: ``handler.start_grace_timer()``; save the checkpoint (collective); log the
   ``preempted`` event (``handler.describe()``); ``handler.cancel()``; ``raise Preempted(step,
   handler.exit_code)``; the worker leaves the process group and exits with that code.

Exit code ``PREEMPT_EXIT_CODE = 75`` (``EX_TEMPFAIL`` of sysexits.h: "temporary failure, try
again later") means "checkpointed, resubmit me". Not 0: a scheduler or the elastic agent would
record the job as finished and never resume it. Not 1: that is any crash (Python exits 1 on an
uncaught exception); it would burn an elastic restart and hide that a checkpoint was written.
Not 143 (128 + SIGTERM): that is what the shell reports for a process killed by SIGTERM, i.e.
one that did *not* checkpoint; 75 tells the two apart.

The signal handler only sets attributes: Python runs it in the main thread between bytecodes,
possibly while that thread holds a lock or is in the middle of a write, so it does no I/O and
takes no lock; the trainer does the work at the step boundary.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import torch

from hpcpipe.train.oom import AllReduceMax, agree_any

PREEMPT_EXIT_CODE = 75
"""Stopped by SIGTERM or SIGUSR1, after a checkpoint when there was time: resubmit the job
(EX_TEMPFAIL; the module docstring says why not 0, 1 or 143)."""
INTERRUPT_EXIT_CODE = 130  # 128 + SIGINT: what a shell reports for Ctrl-C, and what users expect
# SIGINT (Ctrl-C) stops the same orderly way, with its own code: a person, not a scheduler, asked.
DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

_Handler = Callable[[int, FrameType | None], Any] | int | None


class Preempted(BaseException):
    """Raised by the trainer after the preemption checkpoint; the worker exits with ``exit_code``.

    A ``BaseException`` (like ``KeyboardInterrupt``) so that no ``except Exception`` on the way
    up turns an orderly stop into a failure or swallows it.
    """

    def __init__(self, step: int, exit_code: int = PREEMPT_EXIT_CODE, checkpointed: bool = True) -> None:
        what = "interrupted" if exit_code == INTERRUPT_EXIT_CODE else "preempted"
        saved = f"checkpointed at step {step}" if checkpointed else f"stopped at step {step}, no checkpoint"
        super().__init__(f"{what}: {saved}; exit code {exit_code}")
        self.step = step
        self.exit_code = exit_code
        self.checkpointed = checkpointed


class PreemptionHandler:
    """Turns a preemption signal into an agreed stop at the next step boundary.

    ``check_every``: the cross-rank check (one all-reduce of a 1-element int64 tensor) runs on
    every ``check_every``-th call of ``should_stop``; the others return False without
    communicating. The all-reduce costs a few tens of microseconds but is a synchronisation
    point (a GPU tensor read on the host waits for the stream), so with very short steps a
    larger value trades up to ``check_every - 1`` extra steps of latency for less overhead; keep
    ``(check_every - 1) x step time`` well inside the grace period. A single process
    (``all_reduce_max=None``) checks its flag on every call, as that is free.
    """

    def __init__(
        self,
        grace_s: float,
        signals: Sequence[signal.Signals] = DEFAULT_SIGNALS,
        *,
        check_every: int = 1,
        exit_code: int = PREEMPT_EXIT_CODE,
    ) -> None:
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.grace_s = grace_s
        self.signals = tuple(signals)
        self.check_every = check_every
        self.exit_code = exit_code
        self.signum: int | None = None  # the first signal received by this rank
        self.received_at: float | None = None  # time.monotonic() when it arrived
        self.agreed_signum: int | None = None  # a signal some rank received, once the ranks agreed
        self.stop_agreed = False  # set once should_stop returned True
        # What the ranks agreed on: a preemption (checkpoint, exit_code) wins over an interrupt.
        self.agreed_interrupt = False
        self._previous: dict[signal.Signals, _Handler] = {}
        self._calls = 0
        self._timer: threading.Timer | None = None
        self._carried: int | None = None  # agreed in this step's other agreement (carried_by)

    # -- signals -------------------------------------------------------------------------------

    def install(self) -> None:
        """Install the handlers, keeping the previous ones for ``uninstall`` (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("PreemptionHandler.install() must run in the main thread (signal.signal)")
        if self._previous:
            return  # installed twice would record our own handler as the one to restore
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def uninstall(self) -> None:
        """Restore the handlers that were installed before ``install``."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:  # the first signal starts the grace period; repeats change nothing
            self.received_at = time.monotonic()
            self.signum = signum
        elif self.signum == signal.SIGINT and signum != signal.SIGINT:
            self.signum = signum  # a preemption after Ctrl-C wins (exit 75: resubmitted), its clock kept

    def requested_locally(self) -> bool:
        """Whether this rank received a preemption signal."""
        return self.signum is not None

    # -- agreement -----------------------------------------------------------------------------

    def should_stop(self, all_reduce_max: AllReduceMax | None) -> bool:
        """Whether every rank must stop now: the same answer on every rank (a collective).

        ``all_reduce_max`` all-reduces a tensor with MAX over the ranks and returns the result
        (``hpcpipe.train.oom.max_over_ranks``); None for a single process.
        """
        if self.stop_agreed:
            return True
        self._calls += 1
        carried, self._carried = self._carried, None
        if all_reduce_max is None:
            agreed = self._level()
        elif carried is not None:  # every rank ran the same agreements: the same answer
            agreed = carried
        elif self._calls % self.check_every == 0:
            agreed = agree_any(self._level(), all_reduce_max)
        else:
            agreed = 0
        self.stop_agreed, self.agreed_interrupt = agreed > 0, agreed == 1
        return self.stop_agreed

    def checked_every(self, n: int, all_reduce_max: AllReduceMax | None) -> Callable[[], bool]:
        """``should_stop`` on every ``n``-th call of the returned function, False between (a single
        process: on every call, as that is free). For a loop every rank runs the same number of
        times (an evaluation's batches): every rank then agrees after the same iteration, and the
        loop's own collectives stay matched."""
        calls = itertools.count(1)
        every = 1 if all_reduce_max is None else n
        return lambda: next(calls) % every == 0 and self.should_stop(all_reduce_max)

    def _level(self) -> int:
        """0: no signal, 1: Ctrl-C, 2: preemption; the MAX over ranks decides for every rank."""
        return 0 if self.signum is None else 1 if self.signum == signal.SIGINT else 2

    def carried_by(self, all_reduce_max: AllReduceMax) -> AllReduceMax:
        """``all_reduce_max`` with this rank's signal level appended to every tensor it reduces:
        the next ``should_stop`` uses the last such agreement instead of one of its own. Give it
        to an agreement every rank runs at every step (the OOM guard's)."""

        def reduce(tensor: torch.Tensor) -> torch.Tensor:  # (N,) int64 -> (N,)
            level = torch.tensor([self._level()], dtype=tensor.dtype)
            both = all_reduce_max(torch.cat([tensor.reshape(-1), level]))  # (N + 1,)
            self._carried = int(both[-1].item())
            return both[:-1].reshape(tensor.shape)

        return reduce

    @property
    def interrupted(self) -> bool:
        """The ranks agreed on an interrupt (Ctrl-C, SIGINT) and no preemption: the stop exits
        130 and checkpoints only where the job checkpoints."""
        return self.agreed_interrupt

    @property
    def stop_exit_code(self) -> int:
        """The code this rank exits with after the stop."""
        return INTERRUPT_EXIT_CODE if self.interrupted else self.exit_code

    def agree_signal(self, all_reduce_max: AllReduceMax | None) -> None:
        """Every rank learns a signal some rank received (the largest number: a preemption's over
        Ctrl-C's), for the event rank 0 writes: when only another rank was signalled, its
        ``signal`` was null. A collective: every rank calls it at the agreed stop."""
        self.agreed_signum = agree_any(int(self.signum or 0), all_reduce_max) or None

    def describe(self) -> dict[str, Any]:
        """Fields for the ``preempted`` event in events.jsonl."""
        signum = self.signum if self.signum is not None else self.agreed_signum
        return {
            "signal": signal.Signals(signum).name if signum is not None else None,
            "signalled_here": self.requested_locally(),
            "since_signal_s": None if self.received_at is None else time.monotonic() - self.received_at,
            "grace_s": self.grace_s,
            "exit_code": self.stop_exit_code,
        }

    # -- grace period --------------------------------------------------------------------------

    def start_grace_timer(self, on_expire: Callable[[], None] | None = None) -> None:
        """Call ``on_expire`` (default: flush and ``os._exit(exit_code)``) when the grace runs out.

        The grace period counts from the signal on the rank that received it (the scheduler's
        clock started then) and from now on a rank that learned of the stop by agreement. The
        timer thread is a daemon: it never keeps a finished process alive.
        """
        self.cancel()
        elapsed = 0.0 if self.received_at is None else time.monotonic() - self.received_at
        remaining = max(0.0, self.grace_s - elapsed)
        self._timer = threading.Timer(remaining, on_expire or self._expire)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        """Stop the grace timer (the checkpoint finished in time)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        print(
            f"preemption: the checkpoint did not finish within the {self.grace_s:g} s grace period; "
            f"exiting with code {self.stop_exit_code} (the run resumes from the previous checkpoint)",
            file=sys.stderr,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self.stop_exit_code)
