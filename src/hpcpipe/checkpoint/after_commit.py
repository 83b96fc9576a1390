"""Rank 0's work after each commit, one job at a time in a background thread.

Re-read and verify the new checkpoint; only if it verified, prune older ones beyond
``keep_last`` (except multiples of ``keep_every``, the one training resumed from, the new one
and any committed step whose own job is still queued: when saves outrun this thread, a job
must not delete a checkpoint that a later job has yet to verify); then copy it to the durable
tier when due (``tiers.py``). Events go through ``event`` (thread-safe, see ``store.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hpcpipe.checkpoint.manifest import CheckpointError, Problem, step_dir_name, verify_dir
from hpcpipe.checkpoint.tiers import DurableSchedule, Tier
from hpcpipe.config import CheckpointConfig

__all__ = ["AfterCommit", "problem_events"]

EventFn = Callable[[str, dict[str, Any]], None]
log = logging.getLogger("hpcpipe.checkpoint")


def problem_events(
    event: EventFn, kind: str, step: int, path: Path, tier: str, problems: list[Problem]
) -> None:
    """One ``kind`` event (and warning) per problem of the checkpoint ``path``."""
    for problem in problems:
        log.warning("%s: checkpoint %s: %s", kind, path, problem)
        event(kind, {"step": step, "path": str(path), "tier": tier, **problem.to_dict()})


class AfterCommit:
    """Verify, prune and copy to the durable tier, in order, behind the training loop."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        fast: Tier,
        durable: Tier | None,
        token: str,
        event: EventFn,
        resumed_step: Callable[[], int | None],
    ) -> None:
        self.cfg, self.fast, self.durable, self._token = cfg, fast, durable, token
        self._event = event
        self._resumed_step = resumed_step  # never pruned: the run's own starting point
        self._schedule = DurableSchedule(cfg.durable_every_steps, cfg.durable_every_s)
        self._pool = ThreadPoolExecutor(1, "hpcpipe-ckpt-after")
        self._jobs: list[Future[None]] = []
        self._queued: set[int] = set()  # steps reserved or committed whose job has not finished
        self._failed: set[int] = set()  # fast-tier steps that failed verification (retention skips them)
        self._copied: set[int] = set()  # steps this process copied to the durable tier
        self._queued_lock = threading.Lock()

    def reserve(self, step: int) -> None:
        """Protect ``step`` from pruning before its checkpoint is renamed into the tier: a prune
        running now may list it before ``queue`` is called."""
        with self._queued_lock:
            self._queued.add(step)

    def release(self, step: int) -> None:
        """Undo ``reserve`` for a commit that failed."""
        with self._queued_lock:
            self._queued.discard(step)

    def queue(self, step: int, force_durable: bool) -> None:
        self._jobs = [f for f in self._jobs if not f.done()]
        with self._queued_lock:
            self._queued.add(step)
        self._jobs.append(self._pool.submit(self._after_commit_then_release, step, force_durable))

    def queue_durable(self, step: int) -> None:
        """Copy ``step``, committed and queued before, to the durable tier unless it is there or
        failed its verification: a final save of a step the schedule did not copy. It runs after
        that step's own job (one worker thread), so after its verification."""
        self._jobs = [f for f in self._jobs if not f.done()]
        with self._queued_lock:
            self._queued.add(step)
        self._jobs.append(self._pool.submit(self._durable_then_release, step))

    def _durable_then_release(self, step: int) -> None:
        try:
            if self.durable is not None and step not in self._failed and step not in self._copied:
                self._copy_durable(self.fast.root / step_dir_name(step), step)
        finally:
            with self._queued_lock:
                self._queued.discard(step)

    def drain(self) -> None:
        """Finish the queued jobs (raising the first one's error)."""
        jobs, self._jobs = self._jobs, []
        for future in jobs:
            future.result()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

    def _after_commit_then_release(self, step: int, force_durable: bool) -> None:
        try:
            self._after_commit(step, force_durable)
        finally:
            with self._queued_lock:
                self._queued.discard(step)

    def _after_commit(self, step: int, force_durable: bool) -> None:
        path = self.fast.root / step_dir_name(step)
        _, problems = verify_dir(path)
        if problems:
            problem_events(self._event, "checkpoint_verify_failed", step, path, "fast", problems)
            self._failed.add(step)
            return
        self._failed.discard(step)  # saved again, and whole this time
        self._event("checkpoint_verified", {"step": step, "path": str(path)})
        self._prune(self.fast, lambda: self._protected_in_fast(step), frozenset(self._failed))
        self._copied.discard(step)  # a new commit of this step: its earlier copy is not this one
        if self.durable is not None and self._schedule.due(step, force_durable):
            self._copy_durable(path, step)

    def _protected_in_fast(self, step: int) -> set[int]:
        """This job's step, the steps reserved or queued now and the one training resumed from."""
        with self._queued_lock:
            return {step} | self._queued | self._resumed()

    def _resumed(self) -> set[int]:
        """The step training resumed from, kept in every tier (``checkpoint.keep_last``)."""
        resumed = self._resumed_step()
        return {resumed} if resumed is not None else set()

    def _copy_durable(self, path: Path, step: int) -> None:
        assert self.durable is not None
        start = time.perf_counter()
        try:
            final = self.durable.copy_in(path, step, self._token)
        except (CheckpointError, OSError) as exc:
            self._event("checkpoint_durable_failed", {"step": step, "error": str(exc)})
            return
        self._schedule.copied()
        self._copied.add(step)
        self._event(
            "checkpoint_durable_copied",
            {"step": step, "path": str(final), "copy_s": time.perf_counter() - start},
        )
        self._prune(self.durable, lambda: {step} | self._resumed())

    def _prune(
        self, tier: Tier, protected: Callable[[], set[int]], unusable: frozenset[int] = frozenset()
    ) -> None:
        try:
            deleted = tier.prune(self.cfg.keep_last, self.cfg.keep_every, protected, unusable)
        except OSError as exc:
            self._event("checkpoint_prune_failed", {"tier": tier.name, "error": str(exc)})
            return
        if deleted:
            self._event("checkpoint_pruned", {"tier": tier.name, "steps": deleted})
