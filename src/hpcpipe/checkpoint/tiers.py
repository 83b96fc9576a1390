"""A tier is a directory of committed checkpoints: list them, prune them, copy one in, tidy up.

Two tiers, as on large clusters: the *fast* tier (node-local disk, written at every save) and
the *durable* tier (a shared file system), filled in the background with copies of committed
fast checkpoints. Every directory operation that readers could observe is a rename, so a
reader (a resume, ``hpcpipe ckpt list``, a durable copy) sees a checkpoint either complete or
not at all:

- a durable copy is written to ``.tmp-step-…-<id>``, verified against its manifest, then renamed;
- a pruned checkpoint is first renamed to ``.trash-step-…-<id>`` (it leaves the listing in one
  atomic step), then deleted; a crash in between leaves only a ``.trash-*`` directory, which
  ``cleanup_temporaries`` removes at the next start, together with unfinished ``.tmp-*`` saves.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hpcpipe.checkpoint.manifest import (
    MANIFEST_NAME,
    CheckpointError,
    parse_step,
    read_manifest,
    step_dir_name,
    verify_dir,
)
from hpcpipe.fsutil import fsync_dir, fsync_dirs
from hpcpipe.layout import RunLayout

__all__ = ["DurableSchedule", "Tier", "fast_root", "retained_steps"]

_TEMP_RE = re.compile(r"^\.(tmp|trash)-step-\d{8}-[0-9a-z-]+$")
# A committed checkpoint moved aside while the same step's new save is renamed in: whole until
# that rename is done, so a crash between the two renames leaves it to restore, not to delete.
_REPLACED_RE = re.compile(r"^\.replaced-(step-\d{8})-[0-9a-z]+$")


@dataclass(frozen=True)
class Tier:
    """One checkpoint directory (``name`` is "fast" or "durable", for listings and events)."""

    name: str
    root: Path

    def committed(self) -> list[tuple[int, Path]]:
        """(step, directory) of every committed checkpoint, newest first (verified or not)."""
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            step = parse_step(entry.name)
            if step is not None and entry.is_dir(follow_symlinks=False):
                found.append((step, Path(entry.path)))
        return sorted(found, reverse=True)

    def new_temporary(self, step: int, token: str) -> Path:
        """The name a save of ``step`` is written under before it is committed."""
        return self.root / f".tmp-{step_dir_name(step)}-{token}"

    def commit(self, tmp: Path, step: int) -> Path:
        """Rename a finished temporary directory to ``step-NNNNNNNN``. The same step saved again
        (after a resume, a pruned HPO trial) replaces it, newest wins: the old copy is renamed
        aside, the new one in, and only then is the old one deleted (deleting it first left a
        crash during that deletion with neither; ``cleanup_temporaries`` restores a copy moved
        aside whose step has none)."""
        final = self.root / step_dir_name(step)
        fsync_dirs(tmp)  # extra/, deepspeed/...: their entries, not only the top folder's
        aside = self.root / f".replaced-{step_dir_name(step)}-{uuid.uuid4().hex[:12]}"
        try:
            os.replace(final, aside)
            replaced = True
        except FileNotFoundError:
            replaced = False
        os.replace(tmp, final)
        fsync_dir(self.root)
        if replaced:
            shutil.rmtree(aside, ignore_errors=True)
        return final

    def remove(self, path: Path) -> None:
        """Rename out of the listing first, then delete: never a half-deleted ``step-*``."""
        step = parse_step(path.name)
        trash = self.root / f".trash-{step_dir_name(step or 0)}-{uuid.uuid4().hex[:12]}"
        try:
            os.replace(path, trash)
        except FileNotFoundError:
            return
        fsync_dir(self.root)
        shutil.rmtree(trash, ignore_errors=True)

    def prune(
        self,
        keep_last: int,
        keep_every: int,
        protected: Callable[[], set[int]],
        unusable: frozenset[int] = frozenset(),
    ) -> list[int]:
        """Delete committed checkpoints that ``retained_steps`` does not keep; the deleted steps.

        Pruning runs behind the training loop (``after_commit.py``) while saves go on. One listing
        decides and is acted on, so a checkpoint committed after it is neither counted nor
        deleted (acting on a second listing deleted the newest checkpoint as not kept).
        ``protected`` is asked after the listing: the store reserves a step before renaming it
        into the tier (``store.py``), so every listed checkpoint not yet verified is in it then,
        whatever the order of the step numbers (a run that started over beside older, higher
        steps). ``unusable``: steps known to fail verification, which count for nothing."""
        listed = self.committed()
        keep = retained_steps([step for step, _ in listed], keep_last, keep_every, protected(), unusable)
        deleted = []
        for step, path in listed:
            if step not in keep:
                self.remove(path)
                deleted.append(step)
        return deleted

    def check_writable(self, key: str) -> None:
        """CheckpointError naming ``key`` unless this tier's root can be created and written: a
        durable tier that cannot be written would fail every copy in the background, and the run
        would end believing its checkpoints were backed up."""
        probe = self.root / f".tmp-write-probe-{uuid.uuid4().hex[:8]}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise CheckpointError(f"{key} {self.root}: cannot write there ({exc.strerror or exc})") from None

    def cleanup_temporaries(self, spare: str | None = None) -> list[str]:
        """Remove ``.tmp-*`` / ``.trash-*`` directories left by a crash; the names removed.

        Only directories (not links) whose names match what this module creates, only inside
        this tier's root, and none whose name contains ``spare`` (the running store's session
        token: its own save in flight). Run it on one rank at start.
        """
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        removed = []
        for entry in entries:
            ours_now = spare is not None and spare in entry.name
            if _TEMP_RE.match(entry.name) and entry.is_dir(follow_symlinks=False) and not ours_now:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.name)
        for entry in entries:  # after the temporaries: a crash between commit's two renames
            replaced = _REPLACED_RE.match(entry.name)
            if replaced is None or not entry.is_dir(follow_symlinks=False):
                continue
            final = self.root / replaced.group(1)
            if final.exists():
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.name)
            else:  # the new copy never arrived: the old one, whole, is the step again
                os.replace(entry.path, final)
                fsync_dir(self.root)
        return sorted(removed)

    def copy_in(self, src: Path, step: int, token: str = "copy") -> Path:
        """Copy committed checkpoint ``src`` here: temporary name, fsync, verify, rename.

        ``token`` goes into the temporary name (the store passes its session token, so its own
        ``cleanup_temporaries`` leaves a copy in flight alone).
        CheckpointError naming the bad file when the copy does not verify (nothing is renamed).
        """
        manifest = read_manifest(src)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.new_temporary(step, f"{token}-{uuid.uuid4().hex[:8]}")
        try:
            for name in [*manifest.files, MANIFEST_NAME]:
                _copy_durably(src / name, tmp / name)
            _, problems = verify_dir(tmp)
            if problems:
                raise CheckpointError(f"durable copy {tmp}/{problems[0]}")
            return self.commit(tmp, step)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def fast_root(checkpoint_dir: str | None, run_dir: Path) -> Path:
    """The fast tier's directory: ``checkpoint.dir``, or ``<run_dir>/checkpoints`` when null."""
    return Path(checkpoint_dir) if checkpoint_dir else RunLayout(run_dir).checkpoints


def retained_steps(
    steps: list[int],
    keep_last: int,
    keep_every: int,
    protected: set[int],
    unusable: frozenset[int] = frozenset(),
) -> set[int]:
    """The steps retention keeps: the ``keep_last`` newest, multiples of ``keep_every``, protected.
    An ``unusable`` step (it failed verification) is neither counted nor kept: counted, it took
    the place of an older good checkpoint, which was deleted."""
    usable = [step for step in steps if step not in unusable]
    keep = set(sorted(usable, reverse=True)[:keep_last]) | (protected & set(steps))
    if keep_every > 0:
        keep |= {step for step in usable if step % keep_every == 0}
    return keep


def _copy_durably(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as reader, dest.open("wb") as writer:
        shutil.copyfileobj(reader, writer, length=8 << 20)
        writer.flush()
        os.fsync(writer.fileno())
    fsync_dir(dest.parent)


@dataclass
class DurableSchedule:
    """When a committed fast checkpoint is also copied to the durable tier.

    Due when the step is a multiple of ``every_steps``, or ``every_s`` seconds passed since the
    last durable copy; with both 0, every checkpoint is copied. A forced save (the final one,
    a preemption) is always copied.
    """

    every_steps: int
    every_s: float
    last_copy: float = field(default_factory=time.monotonic)

    def due(self, step: int, force: bool = False) -> bool:
        if force or (self.every_steps == 0 and self.every_s == 0):
            return True
        by_step = self.every_steps > 0 and step % self.every_steps == 0
        by_time = self.every_s > 0 and time.monotonic() - self.last_copy >= self.every_s
        return by_step or by_time

    def copied(self) -> None:
        self.last_copy = time.monotonic()
