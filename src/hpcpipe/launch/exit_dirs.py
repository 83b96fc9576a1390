"""The directory a launcher names for its forked workers' exit codes (``HPCPIPE_EXIT_DIR``).

One per launcher process, in the temporary directory, removed at its exit. A launcher killed
outright (SIGKILL: the OOM killer, a lost node's agent) runs no exit code, so on Linux the
directory's name says whose it is: the host's boot id, the launcher's pid namespace and its pid.
The next launcher of the same user on the same host and namespace removes those whose process is
gone. Elsewhere (no /proc) nothing is removed: without the name's facts a pid means nothing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import stat

_PREFIX = "hpcpipe-exit-"
# hpcpipe-exit-BOOT-NAMESPACE-PID-RANDOM (mkdtemp's RANDOM has no "-").
_NAME = re.compile(r"hpcpipe-exit-([0-9a-f]{32})-([0-9]+)-([0-9]+)-[^-]+")


@functools.cache
def exit_dir() -> str:
    """This process's HPCPIPE_EXIT_DIR: made once, because the fork server outlives one agent
    run (a later run reuses it, and the directory its workers were told). Making it first removes
    what launchers killed outright left (``remove_orphaned_exit_dirs``)."""
    import tempfile

    return _launcher_dir(tempfile.gettempdir())


@functools.cache
def short_launcher_dir() -> str:
    """A private directory of this launcher in /tmp, for a Unix socket where $TMPDIR's path is
    too long for one; named as the exit directories, so a launcher killed outright leaves it to
    the next one's sweep."""
    return _launcher_dir(SHORT_ROOT)


SHORT_ROOT = "/tmp"


def _launcher_dir(root: str) -> str:
    import atexit
    import shutil
    import tempfile

    owner = this_host_and_namespace()
    if owner is not None:
        with contextlib.suppress(Exception):  # tidying up must never stop a launcher
            remove_orphaned_exit_dirs(root, *owner)
    boot, namespace = owner or ("0" * 32, 0)
    path = tempfile.mkdtemp(prefix=f"{_PREFIX}{boot}-{namespace}-{os.getpid()}-", dir=root)  # mode 0700
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def this_host_and_namespace() -> tuple[str, int] | None:
    """This host's boot id and this process's pid namespace (its inode), or None where /proc
    does not say. A pid means something only on its host and in its namespace, and one /tmp may
    be shared by containers or, as a scratch TMPDIR, by the nodes of a cluster."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip().replace("-", "")
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return (boot, namespace) if re.fullmatch(r"[0-9a-f]{32}", boot) else None


def remove_orphaned_exit_dirs(root: str, boot: str, namespace: int) -> list[str]:
    """Remove the exit directories in ``root`` that this user's launchers on this host (``boot``)
    and in ``namespace`` left when they died without running their exit code; return their
    paths. Kept: a live pid's (or one not this user's to probe), another host's or namespace's,
    another user's, and anything that is not a plain directory."""
    import shutil

    removed: list[str] = []
    with os.scandir(root) as listing:
        entries = list(listing)
    for entry in entries:
        match = _NAME.fullmatch(entry.name)
        if match is None or match[1] != boot or int(match[2]) != namespace:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or _alive(int(match[3])):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    """Whether ``pid`` names a process; when in doubt, alive (its directory stays)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):  # another user's; no such pid number
        return True
    return True
