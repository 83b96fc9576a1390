"""The memory tier: each node keeps its ranks' files of the newest checkpoint in ``/dev/shm``.

Why: most failures kill one worker, and the agent restarts it on the same node. Reading the
checkpoint back from shared memory skips the disk (DLRover's flash checkpoint does the same).

- **Owned by the node's agent.** ``owned(...)`` (the process that runs the agent, around the
  workers' whole life) creates ``/dev/shm/hpcpipe-ckpt-<uid>-<hash of the checkpoint dir>/``
  (mode 0700; a name that exists as anything but this user's private directory turns the tier
  off rather than being used) and holds a shared ``flock`` on its ``.lock`` file; the last agent
  to let go removes the directory, so a worker that crashes leaves the copy to its successor and
  nothing outlives the job (an agent killed with SIGKILL drops its lock with its life and leaves
  the directory to the next agent on the node, which removes every tier no agent holds). Workers
  use the directory only while some agent holds the lock: one process without an agent has none.
- **Written by the save path, behind the durable tiers.** After a checkpoint committed on disk,
  each rank copies the files it wrote into ``<root>/step-NNNNNNNN/`` (in the background: the
  save does not wait), then removes older steps. The disk checkpoint stays the source of truth.
- **Never trusted without its hash.** A restore reads a file from memory only when the disk
  checkpoint's manifest lists it with that size, and checks the bytes against the manifest's
  hash as it reads them; a copy that differs is passed over for the disk file
  (``safe_dcp.SafeFileSystemReader`` sources). A lost node has no copy: its ranks read the disk.
- **Bounded.** ``checkpoint.memory_limit_gb`` (default: half of ``/dev/shm``) caps what a node
  keeps; a limit larger than ``/dev/shm`` is refused before the workers start; a copy that would
  pass the limit or not fit in the free space is skipped (an event says so), never half-written.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hpcpipe.checkpoint.manifest import parse_step, step_dir_name
from hpcpipe.errors import UserError

__all__ = ["SHM_ROOT", "MemoryTier", "owned", "tier_root"]

Report = Callable[[str, dict[str, Any]], None]
SHM_ROOT = Path("/dev/shm")
_LOCK = ".lock"  # every agent using the tier holds a shared flock on it while it runs
log = logging.getLogger("hpcpipe.checkpoint")


def tier_root(fast_dir: Path, shm: Path = SHM_ROOT) -> Path:
    """The memory tier of the checkpoints in ``fast_dir`` on this node (same path in every process
    of this user)."""
    key = hashlib.sha256(str(Path(fast_dir).resolve()).encode()).hexdigest()[:16]
    return shm / f"hpcpipe-ckpt-{os.getuid()}-{key}"


def _ours(root: Path) -> bool:
    """``root`` is a real directory of this user that only this user can write: ``/dev/shm`` is
    shared by every user of the node, and a name someone else made (or a link) is not used."""
    try:
        info = root.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


def limit_bytes(limit_gb: float | None, shm: Path = SHM_ROOT) -> int:
    """``checkpoint.memory_limit_gb`` in bytes; UserError when larger than ``shm``. None: half of
    ``shm``, and at most a quarter of this job's cgroup memory limit (tmpfs pages count against
    it under Slurm's and Kubernetes' cgroups: a full tier must not get the job killed)."""
    capacity = _capacity(shm)
    if limit_gb is None:
        cgroup = _cgroup_memory_limit()
        return min(capacity // 2, cgroup // 4) if cgroup else capacity // 2
    wanted = int(limit_gb * 1e9)
    if wanted > capacity:
        raise UserError(
            f"checkpoint.memory_limit_gb={limit_gb:g} is larger than {shm} ({capacity / 1e9:.1f} GB on this "
            "node); lower it, or set checkpoint.memory_tier=false"
        )
    return wanted


@contextlib.contextmanager
def owned(fast_dir: Path, limit_gb: float | None, shm: Path = SHM_ROOT) -> Iterator[Path | None]:
    """The agent's side: make the node's memory tier for ``fast_dir`` and remove it afterwards.

    Yields its directory, or None when ``shm`` does not exist (not Linux). UserError (before
    anything is made) when ``limit_gb`` is larger than ``shm``.
    """
    if not shm.is_dir():
        yield None
        return
    limit_bytes(limit_gb, shm)
    root = tier_root(fast_dir, shm)
    _sweep_abandoned(shm, keep=root)
    lock = _hold_shared(root)
    if lock is None:
        log.warning("memory tier off: %s exists and is not a private directory of this user", root)
        yield None
        return
    try:
        yield root
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        try:  # the last owner (no other agent holds the lock) removes the tier
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(root, ignore_errors=True)
        except BlockingIOError:
            pass
        finally:
            os.close(lock)


def _sweep_abandoned(shm: Path, keep: Path) -> None:
    """Remove this user's tiers that no agent holds: an agent killed with SIGKILL (a scheduler's
    last word) left its copy in RAM until a reboot, one per job on a shared node. A tier whose
    lock can be taken exclusively has no owner; an agent that arrives meanwhile finds its lock
    file gone and makes the tier again (``_hold_shared``)."""
    for root in shm.glob(f"hpcpipe-ckpt-{os.getuid()}-*"):
        if root == keep or not _ours(root):
            continue
        try:
            fd = os.open(root / _LOCK, os.O_RDWR)
        except OSError:  # no lock file yet: an agent between mkdir and its lock; leave it
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(root, ignore_errors=True)
        except BlockingIOError:
            pass  # held: a live agent's tier
        finally:
            os.close(fd)


def _hold_shared(root: Path) -> int | None:
    """Make ``root`` (mode 0700) and hold a shared lock on its lock file for the agent's life;
    the descriptor, or None when ``root`` is not this user's private directory. A lock file that
    the last owner removed while this one waited is made again."""
    for _ in range(5):
        with contextlib.suppress(FileExistsError):
            root.mkdir(mode=0o700)
        if not _ours(root):
            if not os.path.lexists(root):
                continue  # gone, not someone else's: another agent's sweep removed it just now
            return None
        try:
            fd = os.open(root / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:  # another agent's sweep removed the abandoned tier just now
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(fd).st_ino == (root / _LOCK).stat().st_ino:
                return fd
        os.close(fd)
    return None


def _has_owner(root: Path) -> bool:
    """Some agent holds the tier's lock (an agent that died holds nothing: its tier is unused)."""
    try:
        fd = os.open(root / _LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class MemoryTier:
    """The workers' side: keep this rank's files of the newest checkpoint, find them again."""

    def __init__(self, root: Path, limit: int) -> None:
        self.root = root
        self.limit = limit
        self._copier = ThreadPoolExecutor(1, "hpcpipe-ckpt-memory")
        self._copies: list[Future[None]] = []

    @classmethod
    def of_agent(cls, fast_dir: Path, limit_gb: float | None, shm: Path = SHM_ROOT) -> MemoryTier | None:
        """The tier an agent made for ``fast_dir`` on this node; None without one."""
        root = tier_root(fast_dir, shm)
        if not _ours(root) or not _has_owner(root):
            return None
        return cls(root, limit_bytes(limit_gb, shm))

    def step_dir(self, step: int) -> Path | None:
        path = self.root / step_dir_name(step)
        return path if path.is_dir() else None

    def keep_in_background(self, step: int, ckpt: Path, names: list[str], report: Report) -> None:
        """``keep`` in this tier's thread (a save does not wait for it); ``report(kind, fields)``
        then gets ``checkpoint_memory_kept`` (step, bytes, copy_s) or ``checkpoint_memory_skipped``
        (step, reason). Copies run one at a time, in order."""
        self._copies = [f for f in self._copies if not f.done()]
        self._copies.append(self._copier.submit(self._keep_and_report, step, ckpt, names, report))

    def close(self) -> None:
        """Finish the copies in flight (call before exit)."""
        for future in self._copies:
            future.result()
        self._copier.shutdown(wait=True)

    def _keep_and_report(self, step: int, ckpt: Path, names: list[str], report: Report) -> None:
        start = time.perf_counter()
        try:
            reason = self.keep(step, ckpt, names)
        except OSError as exc:  # a full or vanished /dev/shm: the disk checkpoint is unaffected
            reason = f"{exc.strerror or exc} ({exc.filename or self.root})"
        if reason is not None:
            log.warning("checkpoint step %d not kept in memory: %s", step, reason)
            report("checkpoint_memory_skipped", {"step": step, "reason": reason})
            return
        nbytes = sum(_bytes_under(self.root / step_dir_name(step) / name) for name in names)
        report(
            "checkpoint_memory_kept", {"step": step, "bytes": nbytes, "copy_s": time.perf_counter() - start}
        )

    def keep(self, step: int, ckpt: Path, names: list[str]) -> str | None:
        """Copy ``names`` (relative to the committed ``ckpt``) in; None, or why they were not kept.

        The budget is the node's: what the tier holds already (other local ranks' files of this
        step included) plus these files. Only steps older than ``step`` are removed: a rank whose
        copy lags must not delete a newer step the others have written.
        """
        need = sum((ckpt / name).stat().st_size for name in names)
        older = [p for p in self._steps() if (parse_step(p.name) or 0) < step]
        freeable = sum(_bytes_under(p) for p in older)
        held = _bytes_under(self.root)
        if need + held - freeable > self.limit:
            return f"{need / 1e9:.2f} GB of files > checkpoint.memory_limit_gb ({self.limit / 1e9:.2f} GB)"
        if need > _free(self.root) + freeable:
            return f"{need / 1e9:.2f} GB of files > free space in {self.root.parent}"
        if need + held > self.limit or need > _free(self.root):
            self._remove(older)  # make room first: the disk copy of the older step remains
            older = []
        target = self.root / step_dir_name(step)
        for name in names:
            _copy_atomically(ckpt / name, target / name)
        self._remove(older)
        return None

    def _steps(self) -> list[Path]:
        return [p for p in self.root.iterdir() if parse_step(p.name) is not None and p.is_dir()]

    def _remove(self, paths: list[Path]) -> None:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)


def _copy_atomically(source: Path, dest: Path) -> None:
    """``dest`` appears whole or not at all (other local ranks read and write the same step dir)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _bytes_under(path: Path) -> int:
    """Bytes of the files at or under ``path``; files another local rank removes meanwhile count 0."""
    files = [path] if path.is_file() else [Path(d) / f for d, _, names in os.walk(path) for f in names]
    total = 0
    for file in files:
        with contextlib.suppress(FileNotFoundError):
            total += file.stat().st_size
    return total


def _cgroup_memory_limit() -> int | None:
    """This process's cgroup v2 ``memory.max`` in bytes; None when unlimited or not readable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        relative = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
        value = (Path("/sys/fs/cgroup") / relative.lstrip("/") / "memory.max").read_text().strip()
    except (OSError, StopIteration, IndexError):
        return None
    return int(value) if value.isdigit() else None


def _capacity(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_blocks * stats.f_frsize


def _free(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize
