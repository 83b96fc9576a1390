"""A throwaway PostgreSQL server for tests: ``initdb`` into a fresh temporary directory, started with
``pg_ctl`` on 127.0.0.1 (free port, fsync off), a database ``hpo`` for a password-protected role
``hpcpipe`` (scram-sha-256); stopped (``-m immediate``) and deleted always, also when starting failed
half-way.

PostgreSQL refuses to run as root. As root, initdb, pg_ctl and createdb run as the ``postgres``
system user (or ``nobody``) through subprocess's ``user=``/``group=`` arguments, in a directory
made under the system temp dir (pytest's own tmp dirs are 0700 root: that user could not traverse
them) and chowned to that user. The password reaches initdb in a 0600 file deleted right after,
and clients through PGPASSWORD: it is never on a command line, in ``url``, ``repr`` or the log.
Binaries are found on PATH (symlinks resolved) or under /usr/lib/postgresql/<version>/bin (Debian).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.integration.mlflow_server import free_port

START_TIMEOUT_S = 60
STEP_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
TOOLS = ("initdb", "pg_ctl", "postgres", "createdb")
SERVER_USERS = ("postgres", "nobody")
SOCKET_PATH_MAX = 107  # sun_path, less the terminating NUL


class PostgresUnavailable(RuntimeError):
    """This machine cannot run the server (binaries or an unprivileged user missing)."""


def _version(bindir: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", bindir.parent.name))


def find_bindir() -> Path | None:
    """The directory holding initdb, pg_ctl, postgres and createdb of one PostgreSQL version."""
    candidates = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(os.path.realpath(on_path)).parent)
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version, reverse=True)
    for bindir in candidates:
        if all(os.access(bindir / tool, os.X_OK) for tool in TOOLS):
            return bindir
    return None


def server_account() -> pwd.struct_passwd | None:
    """Whom the server runs as: None (ourselves) unless root, then `postgres` or else `nobody`."""
    if os.geteuid() != 0:
        return None
    for name in SERVER_USERS:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise PostgresUnavailable(f"running as root and none of the users {', '.join(SERVER_USERS)} exists")


def missing_capability() -> str | None:
    """Why this machine cannot start the server (one line), or None."""
    if find_bindir() is None:
        return f"PostgreSQL not installed ({', '.join(TOOLS)}): apt-get install postgresql (make system-deps)"
    try:
        server_account()
    except PostgresUnavailable as exc:
        return str(exc)
    return None


def _traversable(path: Path, account: pwd.struct_passwd) -> bool:
    st = path.stat()
    if st.st_uid == account.pw_uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == account.pw_gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


class PostgresServer:
    """``with PostgresServer() as pg: ...`` or ``pg = PostgresServer().start(); ...; pg.stop()``."""

    def __init__(self, base: Path | None = None, *, user: str = "hpcpipe", database: str = "hpo") -> None:
        reason = missing_capability()
        bindir = find_bindir()
        if reason or bindir is None:
            raise PostgresUnavailable(reason or "PostgreSQL not installed")
        self.bindir = bindir
        self.account = server_account()
        self.base = base  # parent of the server's directory; None: the system temp dir
        self.host = "127.0.0.1"
        self.port = 0
        self.user = user
        self.password = secrets.token_urlsafe(18)
        self.database = database
        self.root: Path | None = None  # kept after stop() so that tests can check it is gone
        self._live = False

    # ----- what clients use -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """libpq URL without the password (clients take it from PGPASSWORD, see `env`)."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"

    @property
    def sqlalchemy_url(self) -> str:
        return self.url.replace("postgresql://", "postgresql+psycopg://", 1)

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus PGHOST, PGPORT, PGUSER, PGDATABASE and PGPASSWORD, for subprocesses."""
        return {
            **os.environ,
            "PGHOST": self.host,
            "PGPORT": str(self.port),
            "PGUSER": self.user,
            "PGDATABASE": self.database,
            "PGPASSWORD": self.password,
        }

    @property
    def data_dir(self) -> Path:
        return self._dir() / "data"

    @property
    def socket_dir(self) -> Path:
        return self._dir() / "sock"

    @property
    def log(self) -> Path:
        return self._dir() / "server.log"

    def connect(self, **kwargs: Any) -> Any:
        import psycopg

        return psycopg.connect(
            host=self.host, port=self.port, user=self.user, password=self.password,
            dbname=self.database, connect_timeout=10, **kwargs,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"PostgresServer({self.url}, root={self.root}, live={self._live})"

    # ----- lifecycle --------------------------------------------------------------------------------

    def start(self) -> PostgresServer:
        if self._live:
            raise RuntimeError("PostgresServer already started")
        self._live = True
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop at once (``pg_ctl stop -m immediate``, SIGKILL if that fails) and delete the directory.

        Idempotent; never raises for a server that is already gone."""
        atexit.unregister(self.stop)
        if not self._live:
            return
        self._live = False
        root = self.root
        if root is None:
            return
        data = root / "data"
        try:
            if (data / "postmaster.pid").exists():
                with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                    self._run(
                        "pg_ctl", "-D", str(data), "-m", "immediate", "-w", "-t", str(STOP_TIMEOUT_S), "stop",
                        timeout=STOP_TIMEOUT_S + 10, check=False,
                    )  # fmt: skip
                self._kill_postmaster(data)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ----- internals --------------------------------------------------------------------------------

    def _dir(self) -> Path:
        if self.root is None:
            raise RuntimeError("PostgresServer not started")
        return self.root

    def _start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="hpcpipe-pg-", dir=self.base))
        if self.account is not None:
            blocked = [p for p in self.root.parents if not _traversable(p, self.account)]
            if blocked:
                raise RuntimeError(
                    f"user {self.account.pw_name} cannot traverse {blocked[0]}: pass another base directory"
                )
            os.chown(self.root, self.account.pw_uid, self.account.pw_gid)
        self.socket_dir.mkdir(mode=0o700)
        self._own(self.socket_dir)

        pwfile = self.root / "pwfile"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.password + "\n")
        self._own(pwfile)
        try:
            self._run(
                "initdb", "-D", str(self.data_dir), "-U", self.user, "--auth=scram-sha-256",
                f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C", "--no-sync",
                timeout=STEP_TIMEOUT_S,
            )  # fmt: skip
        finally:
            pwfile.unlink(missing_ok=True)

        for attempt in range(3):  # the free port may be taken between free_port() and bind()
            self.port = free_port()
            if len(str(self.socket_dir / f".s.PGSQL.{self.port}")) > SOCKET_PATH_MAX:
                raise RuntimeError(f"socket path under {self.socket_dir} too long: pass a shorter base")
            options = " ".join(
                [
                    f"-c listen_addresses={self.host}",
                    f"-p {self.port}",
                    f"-c unix_socket_directories={shlex.quote(str(self.socket_dir))}",
                    "-c fsync=off",
                    "-c synchronous_commit=off",
                    "-c full_page_writes=off",
                ]
            )
            started = self._run(
                "pg_ctl", "-D", str(self.data_dir), "-o", options, "-l", str(self.log),
                "-w", "-t", str(START_TIMEOUT_S), "start",
                timeout=START_TIMEOUT_S + 10, check=False,
            )  # fmt: skip
            if started.returncode == 0:
                break
            if attempt == 2 or "could not bind" not in _tail(self.log):
                raise RuntimeError(self._failure("pg_ctl start", started))

        self._run(
            "createdb", "-h", self.host, "-p", str(self.port), "-U", self.user, self.database,
            timeout=STEP_TIMEOUT_S, env={"PGPASSWORD": self.password},
        )  # fmt: skip

    def _own(self, path: Path) -> None:
        if self.account is not None:
            os.chown(path, self.account.pw_uid, self.account.pw_gid)

    def _run(
        self, tool: str, *args: str, timeout: float, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run one PostgreSQL tool as the server's account, in its directory, with a timeout."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        clean["HOME"] = str(self.root)
        clean.update(env or {})
        switch: dict[str, Any] = {}
        if self.account is not None:
            switch = {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}
        proc = subprocess.run(
            [str(self.bindir / tool), *args],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False,
            cwd=self.root, env=clean, **switch,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise RuntimeError(self._failure(tool, proc))
        return proc

    def _failure(self, what: str, proc: subprocess.CompletedProcess[str]) -> str:
        return (
            f"{what} failed (exit {proc.returncode}): {(proc.stdout + proc.stderr).strip()[-2000:]}\n"
            f"--- server log ---\n{_tail(self.log) if self.root else ''}"
        )

    @staticmethod
    def _kill_postmaster(data: Path) -> None:
        """SIGKILL a postmaster that `pg_ctl stop` left running (its pid is postmaster.pid's 1st line)."""
        try:
            pid = int((data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        with contextlib.suppress(OSError):  # a stale pid file: make sure the pid is still a postgres
            if b"postgres" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
