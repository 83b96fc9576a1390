"""The directory a launcher names for its forked workers' exit codes (``HPCPIPE_EXIT_DIR``).

One per launcher process, in the temporary directory, removed at its exit. A launcher killed
outright (SIGKILL: the OOM killer, a lost node's agent) runs no exit code, so the directory's name
carries the launcher's pid namespace and pid, and the next launcher of the same user removes
those whose process is gone.
"""

from __future__ import annotations

import functools
import os


@functools.cache
def exit_dir() -> str:
    """This process's HPCPIPE_EXIT_DIR: made once, because the fork server outlives one agent
    run (a later run reuses it, and the directory its workers were told). Making it first removes
    what launchers killed outright left (``remove_orphaned_exit_dirs``)."""
    import atexit
    import shutil
    import tempfile

    root = tempfile.gettempdir()
    namespace = _pid_namespace()
    if namespace is not None:
        remove_orphaned_exit_dirs(root, namespace)
    path = tempfile.mkdtemp(prefix=f"{_EXIT_PREFIX}{namespace or 0}-{os.getpid()}-", dir=root)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


_EXIT_PREFIX = "hpcpipe-exit-"


def _pid_namespace() -> int | None:
    """This process's pid namespace (its inode), or None where /proc does not say: a pid means
    something only within its namespace, and containers may share one /tmp."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def remove_orphaned_exit_dirs(root: str, namespace: int) -> list[str]:
    """Remove the exit directories in ``root`` that this user's launchers in ``namespace`` left
    when they died without running their exit code; return their paths. A directory is kept when
    its pid is alive (or not this user's to probe), when it is another namespace's or another
    user's, and when it is not a plain directory."""
    import shutil
    import stat

    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        owner = _exit_dir_owner(entry.name)
        if owner is None or owner[0] != namespace or _alive(owner[1]):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def _exit_dir_owner(name: str) -> tuple[int, int] | None:
    """(namespace, pid) from an exit directory's name, "hpcpipe-exit-NS-PID-RANDOM"; else None."""
    if not name.startswith(_EXIT_PREFIX):
        return None
    parts = name[len(_EXIT_PREFIX) :].split("-", 2)
    if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
