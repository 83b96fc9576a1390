"""The checkpoint store: save (sync or async), atomic commit, verified resume with fallback, retention.

What the trainer calls (every call is collective: all ranks, same order; the constructor creates
a gloo process group when the default group is initialized)::

    store = CheckpointStore(job.checkpoint, root, rank, world_size, job.config_hash(), events)
    store.cleanup_temporaries()            # at start; does the work on rank 0 only
    extra = store.restore(model, optimizer)  # None: start fresh; else this rank's extra dict
    ...
    store.save(step, model, optimizer, extra)  # every checkpoint.every_steps
    ...
    store.close()                          # finishes a save in flight, then background work

**Layout.** ``<root>/step-00000040/`` holds DCP's files (``.metadata``, ``__<rank>_<n>.distcp``
with tensors as raw bytes, ``raw_format.py``), ``extra/rank-NNNNN.pt`` (each rank's trainer
state, see ``state.py``) and ``manifest.json`` (hash and size of every other file, step, world
size, config hash, ``tensor_format``).

**Save and commit.** Every rank writes into ``<root>/.tmp-step-00000040-<session>-<n>`` through
DCP (model and optimizer from ``get_state_dict``: plain, DDP and FSDP2 modules alike; sharded
under FSDP2), hashing while it writes and fsyncing each file. DCP's own final gather means that
when ``dcp.save`` returns, every rank's files are on disk. The ranks then gather their
(file, sha256, size) lists to rank 0, which writes ``manifest.json``, fsyncs, and renames the
directory to ``step-00000040``; the outcome is broadcast, so a failure (a full disk) raises the
same ``CheckpointError`` on every rank and leaves the previous checkpoints untouched.

**Async save** (``checkpoint.async``). ``save`` blocks only while the state is copied into a
reusable CPU staging buffer (``staging.py``); DCP write, digest gather, commit and broadcast
then run in one background thread per rank. They use a dedicated gloo process group created
by the constructor, so the background collectives never interleave with the training loop's
collectives on the default group, and every rank's background thread runs the same sequence of
collectives. The cross-rank completion signal is therefore DCP's final gather plus our digest
gather: rank 0 commits only after both. ``save`` first waits for the previous save (one in
flight at most); ``wait()`` / ``close()`` finish it. An error of a background save is raised,
on every rank, by the next ``save``/``wait``/``close``.

**After a commit** rank 0 verifies, prunes and copies to the durable tier in the background
(``after_commit.py``); every rank copies its files into the node's memory tier, when an agent
made one (``memory_tier.py``).

**Resume.** Rank 0 lists committed checkpoints of both tiers, newest first (fast before durable
for the same step), and settles on the first whose manifest and file sizes check; the choice is
broadcast. Every rank then loads it, reading each file once and checking its hash as it reads
(``dcp_load.py``, ``file_reader.py``; without DCP's load planner when every rank's state has
the checkpoint's layout, ``same_layout.py``; copies in the node's memory tier first). A file
that differs on any rank is a ``checkpoint_fallback`` event naming it, and all ranks move on to
the next candidate together (with ``scratch_if_none_verify`` rank 0 hashes before anything loads).
DCP reshards on load, so a checkpoint written at one world size (or strategy) loads at another.
Rank ``r`` gets ``extra`` of rank ``r`` when the checkpoint has it, else rank 0's (after a
world-size change only the rank-independent parts of it are meaningful; ``store.restored`` says
which rank's it was).

**Events** (rank 0 only, ``events(kind, fields)``, possibly from a background thread, so the
callback must be thread-safe, e.g. one ``append_event`` line per call): the ``checkpoint_*``
kinds of ``observe/event_kinds.py``, with their fields (docs/reference/events.md).

**Limit.** Rank 0 must see every rank's files: ``checkpoint.dir`` must be one directory shared by
all ranks (a node-local fast tier is right for single-node jobs; the commit names a missing
rank file clearly when it is not shared).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpcpipe.checkpoint.after_commit import AfterCommit, problem_events
from hpcpipe.checkpoint.dcp_load import CorruptCheckpoint, load_verified
from hpcpipe.checkpoint.deepspeed_io import ENGINE as ENGINE_DEEPSPEED
from hpcpipe.checkpoint.deepspeed_io import check_resumable, load_engine, save_engine, write_extra
from hpcpipe.checkpoint.manifest import (
    CheckpointError,
    FileEntry,
    FileMismatch,
    Manifest,
    Problem,
    new_hasher,
    read_manifest,
    step_dir_name,
    write_manifest,
)
from hpcpipe.checkpoint.memory_tier import MemoryTier
from hpcpipe.checkpoint.raw_format import TENSOR_FORMAT
from hpcpipe.checkpoint.resume_choice import choose_checkpoint, earlier_run
from hpcpipe.checkpoint.safe_dcp import HashedFileSystemWriter
from hpcpipe.checkpoint.save_errors import disk_cause, save_error_message
from hpcpipe.checkpoint.staging import Staging
from hpcpipe.checkpoint.state import extra_name, load_extra, serialize_extra
from hpcpipe.checkpoint.tiers import Tier
from hpcpipe.config import CheckpointConfig

__all__ = ["CheckpointStore", "EventFn", "RestoreInfo"]

EventFn = Callable[[str, dict[str, Any]], None]
log = logging.getLogger("hpcpipe.checkpoint")


@dataclass(frozen=True)
class RestoreInfo:
    """What ``restore`` loaded: for the trainer's log and for world-size-aware decisions."""

    step: int
    path: Path
    tier: str
    saved_world_size: int
    extra_rank: int  # whose extra this rank got (its own, or rank 0's after a world-size change)
    layout: dict[str, Any] | None = None  # the manifest's (pp, dp, tp, ...), where it recorded one


class CheckpointStore:
    """Saves, commits, verifies, restores and prunes the checkpoints of one run (see module doc)."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        root: Path,
        rank: int = 0,
        world_size: int = 1,
        config_hash: str = "",
        events: EventFn | None = None,
        trainable_only: bool = False,
        engine: str = "dcp",
        layout: dict[str, Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.layout = layout  # recorded in each manifest (train/mesh.py Layout.describe)
        # Pipeline stages hold different parameters: their optimizer state is saved flat, by name.
        self.flat_optimizer = bool(layout and layout.get("pp", 1) > 1)
        # "deepspeed": model and optimizer are a DeepSpeed engine's, saved in its own format
        # (deepspeed_io.py); everything else (manifest, commit, fallback, tiers) is the same.
        self.engine = engine
        # Only parameters that require grad (LoRA adapters) and their optimizer state are saved;
        # restoring loads those and leaves the rest as built (the frozen base, from its source).
        self.trainable_only = trainable_only
        new_hasher(cfg.hash)  # a missing blake3 package fails here, before any training
        self.rank = rank
        self.world_size = world_size
        self.config_hash = config_hash
        self.fast = Tier("fast", Path(root))
        self.durable = Tier("durable", Path(cfg.durable_dir)) if cfg.durable_dir else None
        self.restored: RestoreInfo | None = None
        self.last_committed: int | None = None
        self._last_saved: int | None = None  # the step of the last save(), in flight or committed
        self._events = events
        self._pg = _checkpoint_group(world_size)  # collective: all ranks construct together
        self._token = str(self._broadcast(_session_token() if rank == 0 else None))
        self._count = 0
        self._writer = ThreadPoolExecutor(1, "hpcpipe-ckpt-write") if cfg.async_save else None
        self._inflight: Future[None] | None = None
        self._after = (
            AfterCommit(cfg, self.fast, self.durable, self._token, self._event, self._resumed_step)
            if rank == 0
            else None
        )
        self.memory = MemoryTier.of_agent(Path(root), cfg.memory_limit_gb) if cfg.memory_tier else None
        # Called as save_point(point, step) at "shards" (this rank's files are written, nothing
        # gathered) and "manifest" (rank 0: manifest written, not yet renamed into place): where
        # the chaos suite kills or preempts a save (the trainer sets it; the store knows no faults).
        self.save_point: Callable[[str, int], None] | None = None
        self._staging = Staging(cfg.io_threads) if cfg.async_save else None

    # -- start-up ----------------------------------------------------------------------------

    def cleanup_temporaries(self) -> list[str]:
        """Remove unfinished saves and half-deleted checkpoints of earlier runs (rank 0 only)."""
        if self.rank != 0:
            return []
        removed = self.fast.cleanup_temporaries(spare=self._token)
        if self.durable is not None:
            self.durable.check_writable("checkpoint.durable_dir")
            removed += self.durable.cleanup_temporaries(spare=self._token)
        if removed:
            self._event("checkpoint_temporaries_removed", {"names": removed})
        return removed

    # -- saving ------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        extra: dict[str, Any],
        force_durable: bool = False,
    ) -> None:
        """Checkpoint ``step`` (collective). Sync: returns after the commit; async: after staging.

        ``extra`` is this rank's trainer state (see ``state.check_extra`` for what it may hold);
        ``force_durable`` copies this one to the durable tier whatever the schedule says.
        CheckpointError (one line, naming the path) when this or the previous save failed.
        """
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.wait()
        if step == self._last_saved == self.last_committed:
            # A final save of the step just saved (preempted or pruned right after it): written
            # again, its commit raced the first copy's checks. A durable copy is what it adds.
            if force_durable and self._after is not None:
                self._after.queue_durable(step)
            return
        self._last_saved = step
        start = time.perf_counter()
        self._count += 1
        tmp = self.fast.new_temporary(step, f"{self._token}-{self._count}")
        if self.engine == ENGINE_DEEPSPEED:
            self._save_deepspeed(model, serialize_extra(extra), tmp, step, force_durable)
            return
        options = self._sd_options("flat" if self.flat_optimizer else "nested")
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        state = {"model": model_sd, "optim": optim_sd}
        writer = HashedFileSystemWriter(
            tmp, extra_name(self.rank), serialize_extra(extra), self.cfg.io_threads, self.cfg.hash
        )
        if self._writer is None:
            self._write_and_commit(state, writer, tmp, step, force_durable)
            return
        assert self._staging is not None
        staged = self._staging.stage(state)  # the part of an async save that blocks
        self._inflight = self._writer.submit(self._write_and_commit, staged, writer, tmp, step, force_durable)
        self._event("checkpoint_staged", {"step": step, "blocking_s": time.perf_counter() - start})

    def wait(self) -> None:
        """Finish the save in flight, if any; raises its CheckpointError. Call on every rank."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

    def close(self) -> None:
        """Finish the save in flight, then the queued verification/retention/durable copies.

        Call it on every rank before the process group goes away (the background save uses it)
        and before exit; the store cannot save after it.
        """
        try:
            self.wait()
        finally:
            try:
                if self._after is not None:
                    self._after.drain()
            finally:
                if self._writer is not None:
                    self._writer.shutdown(wait=True)
                if self._staging is not None:
                    self._staging.close()
                if self._after is not None:
                    self._after.shutdown()
                if self.memory is not None:
                    self.memory.close()

    def _write_and_commit(
        self, state: dict[str, Any], writer: HashedFileSystemWriter, tmp: Path, step: int, force: bool
    ) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        start = time.perf_counter()
        try:
            dcp.save(state, storage_writer=writer, **self._dcp_group())
        except (CheckpointException, OSError) as exc:
            writer.hashing_fs.join_other_writers()
            cause = disk_cause(exc, tmp)  # before the discard frees space
            self._discard(tmp)
            if cause is None:
                raise  # not the disk: a bug, whose traceback is worth seeing
            message = save_error_message(step, tmp, cause)
            self._event(
                "checkpoint_save_failed",
                {"step": step, "path": str(self.fast.root / step_dir_name(step)), "error": message},
            )
            raise CheckpointError(message) from None
        self._commit_everywhere(tmp, step, writer.digests(), start, force)

    def _save_deepspeed(self, engine: Any, extra: bytes, tmp: Path, step: int, force: bool) -> None:
        """The engine's own files and this rank's extra, then the same commit as for DCP."""
        start = time.perf_counter()
        entries: dict[str, FileEntry] = {}
        message = None
        try:
            entries = save_engine(engine, tmp, step, self.rank, self.cfg.hash, self.trainable_only)
            entries[extra_name(self.rank)] = write_extra(tmp, extra_name(self.rank), extra, self.cfg.hash)
        except (OSError, RuntimeError) as exc:  # torch's zip writer reports a full disk as RuntimeError
            cause = disk_cause(exc, tmp)
            if cause is None:
                raise  # not the disk: a bug, whose traceback is worth seeing
            message = save_error_message(step, tmp, cause)
        message = self._first_error(message)  # every rank learns of any rank's failure
        if message is not None:
            self._discard(tmp)
            self._event(
                "checkpoint_save_failed",
                {"step": step, "path": str(self.fast.root / step_dir_name(step)), "error": message},
            )
            raise CheckpointError(message)
        self._commit_everywhere(tmp, step, entries, start, force)

    def _commit_everywhere(
        self, tmp: Path, step: int, written: dict[str, FileEntry], start: float, force: bool
    ) -> None:
        """Every rank's files are on disk: gather their hashes, commit on rank 0, agree on the outcome."""
        if self.save_point is not None:
            self.save_point("shards", step)
        entries = self._gather(written)
        outcome = self._commit(tmp, step, entries) if self.rank == 0 else None
        outcome = self._broadcast(outcome)
        if isinstance(outcome, str):
            raise CheckpointError(outcome)
        self.last_committed = step
        if self.memory is not None:  # this rank's files, copied into the node's memory tier
            self.memory.keep_in_background(
                step, self.fast.root / step_dir_name(step), list(written), self._event
            )
        if self.rank == 0:
            self._event(
                "checkpoint_committed",
                {
                    "step": step,
                    "path": str(self.fast.root / step_dir_name(step)),
                    "bytes": sum(e.size for e in entries.values()),
                    "files": len(entries),
                    "write_s": time.perf_counter() - start,
                },
            )
            assert self._after is not None
            self._after.queue(step, force)

    def _commit(self, tmp: Path, step: int, entries: dict[str, FileEntry]) -> str | int:
        """Rank 0: manifest, fsync, rename. The step, or an error message for every rank."""
        try:
            for name, entry in entries.items():
                size = (tmp / name).stat().st_size
                if size != entry.size:
                    return f"checkpoint step {step}: {tmp / name} has {size} bytes, written {entry.size}"
            manifest = Manifest(
                step,
                self.world_size,
                self.config_hash,
                entries,
                hash=self.cfg.hash,
                engine=self.engine,
                tensor_format=TENSOR_FORMAT if self.engine != ENGINE_DEEPSPEED else "torch_save",
                layout=self.layout,
                optimizer_state="flat" if self.flat_optimizer else "nested",
            )
            write_manifest(tmp, manifest, sync_dir=False)  # the commit fsyncs the directory
            if self.save_point is not None:
                self.save_point("manifest", step)
            self._rename_into_place(tmp, step)
        except FileNotFoundError as exc:
            self._discard(tmp)
            return (
                f"checkpoint step {step}: {exc.filename} is not visible on rank 0; "
                "checkpoint.dir must be a directory shared by all ranks"
            )
        except OSError as exc:
            self._discard(tmp)
            return save_error_message(step, tmp, exc)
        return step

    def _rename_into_place(self, tmp: Path, step: int) -> None:
        """Rank 0: commit ``tmp`` as ``step``, reserved first: the after-commit thread may be
        pruning this tier now, and must not delete a checkpoint it has yet to verify."""
        assert self._after is not None
        self._after.reserve(step)
        try:
            self.fast.commit(tmp, step)
        except OSError:
            self._after.release(step)
            raise

    def _discard(self, tmp: Path) -> None:
        if self.rank == 0:
            self.fast.remove(tmp)

    # -- resuming ----------------------------------------------------------------------------

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """Load the newest checkpoint that verifies (collective); this rank's extra, or None.

        None when ``checkpoint.resume=never``, when there is no checkpoint, or when none
        verifies and ``checkpoint.scratch_if_none_verify`` is set. CheckpointError (exit 2)
        when checkpoints exist but none verifies, or ``resume=required`` finds nothing.
        Every rank verifies the files it reads while it loads them; a file that does not match
        on any rank makes all ranks fall back to the next candidate together.
        """
        self.wait()
        if self.cfg.resume == "never":
            self._refuse_to_mix_runs()
            return None
        failed: dict[str, str] = {}  # rank 0: candidates whose load found a bad file -> first problem
        while True:
            choice = self._broadcast(self._choose_or_error(failed) if self.rank == 0 else None)
            assert isinstance(choice, dict)
            if choice["action"] == "error":
                raise CheckpointError(choice["message"])
            if choice["action"] != "load":
                return None
            path = Path(choice["path"])
            try:
                return self._load(path, choice["tier"], model, optimizer)
            except CorruptCheckpoint as exc:  # raised on every rank together
                self._problem_events(
                    "checkpoint_fallback", choice["step"], path, choice["tier"], exc.problems
                )
                failed[str(path)] = f"{path}/{exc.problems[0]}"

    def _refuse_to_mix_runs(self) -> None:
        """``resume=never`` beside an earlier run's checkpoints (``resume_choice.earlier_run``):
        refused on every rank."""
        message = None
        if self.rank == 0:
            tiers = [self.fast] + ([self.durable] if self.durable is not None else [])
            message = earlier_run(tiers, os.environ)
        message = self._broadcast(message)
        if message is not None:
            raise CheckpointError(str(message))

    def _choose_or_error(self, failed: dict[str, str]) -> dict[str, Any]:
        """Rank 0's choice (``resume_choice.py``), an unexpected I/O error made an answer for every rank."""
        try:
            tiers = [self.fast] + ([self.durable] if self.durable is not None else [])
            content = self.cfg.scratch_if_none_verify or self.engine == ENGINE_DEEPSPEED
            return choose_checkpoint(self.cfg, tiers, failed, content, self._event)
        except OSError as exc:
            return {"action": "error", "message": f"cannot read checkpoints: {exc}"}

    def _load(
        self, path: Path, tier: str, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        start = time.perf_counter()
        manifest = read_manifest(path)
        from_memory = 0
        if ENGINE_DEEPSPEED in (manifest.engine, self.engine):
            self._load_deepspeed(path, manifest, model)
        else:
            from_memory = self._load_dcp(path, manifest, model, optimizer)
        return self._restored_extra(path, manifest, tier, start, from_memory)

    def _load_deepspeed(self, path: Path, manifest: Manifest, engine: Any) -> None:
        """A DeepSpeed checkpoint into a DeepSpeed engine at the world size that wrote it."""
        check_resumable(path, manifest.engine, manifest.world_size, self.engine, self.world_size)
        message = None
        try:
            load_engine(engine, path, manifest.step, self.trainable_only)
        except CheckpointError as exc:
            message = str(exc)
        message = self._first_error(message)
        if message is not None:
            raise CheckpointError(message)

    def _load_dcp(
        self, path: Path, manifest: Manifest, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> int:
        """Load through the verifying reader (memory-tier copies first); files read from memory."""
        copy = self.memory.step_dir(manifest.step) if self.memory is not None else None
        sources = [copy] if copy is not None else []
        reader = load_verified(
            path,
            manifest,
            model,
            optimizer,
            self._sd_options(manifest.optimizer_state),
            self._dcp_group(),
            sources,
            self.cfg.io_threads,
        )
        return sum(1 for source in reader.read_from.values() if source in sources)

    def _restored_extra(
        self, path: Path, manifest: Manifest, tier: str, start: float, from_memory: int
    ) -> dict[str, Any]:
        extra_rank = self.rank if (path / extra_name(self.rank)).is_file() else 0
        extra = self._load_extra_everywhere(path, extra_name(extra_rank), manifest)
        self.restored = RestoreInfo(
            manifest.step, path, tier, manifest.world_size, extra_rank, manifest.layout
        )
        self._event(
            "checkpoint_restored",
            {
                "step": manifest.step,
                "path": str(path),
                "tier": tier,
                "saved_world_size": manifest.world_size,
                "load_s": time.perf_counter() - start,
                "same_config": manifest.config_hash == self.config_hash,
                "memory_files": from_memory,  # rank 0's files read from the node's memory tier
            },
        )
        return extra

    # -- helpers -----------------------------------------------------------------------------

    def _sd_options(self, optimizer_state: str) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # strict=False when trainable-only: the frozen keys are absent from the checkpoint.
        return StateDictOptions(
            ignore_frozen_params=self.trainable_only,
            strict=not self.trainable_only,
            flatten_optimizer_state_dict=optimizer_state == "flat",
        )

    def _event(self, kind: str, fields: dict[str, Any]) -> None:
        """Events come from rank 0 only; ``events`` may be called from a background thread."""
        if self.rank != 0:
            return
        log.info("%s %s", kind, fields)
        if self._events is not None:
            self._events(kind, fields)

    def _problem_events(self, kind: str, step: int, path: Path, tier: str, problems: list[Problem]) -> None:
        problem_events(self._event, kind, step, path, tier, problems)

    def _resumed_step(self) -> int | None:
        return self.restored.step if self.restored else None

    def _dcp_group(self) -> dict[str, Any]:
        return {"process_group": self._pg} if self._pg is not None else {"no_dist": True}

    def _load_extra_everywhere(self, ckpt: Path, name: str, manifest: Manifest) -> dict[str, Any]:
        """This rank's trainer state; a refusal on any rank is raised on every rank (collective):
        the others would otherwise train on into a collective their peer never joins. A file
        that differs from the manifest on any rank is CorruptCheckpoint everywhere (fall back)."""
        extra: dict[str, Any] = {}
        refused: tuple[str, Problem | None] | None = None
        try:
            extra = load_extra(ckpt / name, manifest.files.get(name), manifest.hash)
        except FileMismatch as exc:
            refused = (str(exc), exc.problem)
        except CheckpointError as exc:
            refused = (str(exc), None)
        found = self._all_gather(refused)
        problems = [problem for _, problem in filter(None, found) if problem is not None]
        if problems:
            raise CorruptCheckpoint(ckpt, problems)
        message = next((text for text, _ in filter(None, found)), None)
        if message:
            raise CheckpointError(message)
        return extra

    def _all_gather(self, value: Any) -> list[Any]:
        if self._pg is None:
            return [value]
        found: list[Any] = [None] * self.world_size
        dist.all_gather_object(found, value, group=self._pg)
        return found

    def _first_error(self, message: str | None) -> str | None:
        """Any rank's error message (the lowest rank's), on every rank (collective)."""
        return next((text for text in self._all_gather(message) if text), None)

    def _broadcast(self, value: Any) -> Any:
        if self._pg is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self._pg)
        return box[0]

    def _gather(self, entries: dict[str, FileEntry]) -> dict[str, FileEntry]:
        """Every rank's written files, merged on rank 0 (other ranks get their own back)."""
        if self._pg is None:
            return entries
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(entries, gathered, dst=0, group=self._pg)
        if gathered is None:
            return entries
        merged: dict[str, FileEntry] = {}
        for part in gathered:
            merged.update(part)
        return merged


def _checkpoint_group(world_size: int) -> dist.ProcessGroup | None:
    """A gloo group for checkpoint coordination (CPU objects, background threads), or None."""
    if world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_world_size() != world_size:
        raise ValueError(f"CheckpointStore: world_size {world_size} != {dist.get_world_size()} ranks")
    group = dist.new_group(backend="gloo")
    assert isinstance(group, dist.ProcessGroup)  # every rank is a member
    return group


def _session_token() -> str:
    import uuid

    return uuid.uuid4().hex[:12]
