"""The manifest of a committed checkpoint, and verifying a directory against it.

``manifest.json`` is the last file written into a checkpoint before the directory is renamed to
``step-<8 digits>``; it lists every other file with its size and hash (SHA-256 by default, or
BLAKE3 with ``checkpoint.hash=blake3``: 4.5x faster on this project's CPU; the manifest names
its algorithm, and a manifest without one is SHA-256). A directory verifies
when the manifest parses, every listed file is there with that size and hash, and no unlisted
file is present (committed directories are written only by hpcpipe, so a stray file is a sign
of tampering or a mixed-up copy). Verification reads every byte, so it uses a few threads:
``hashlib`` releases the GIL, and hashing is the cost of a resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hpcpipe.errors import UserError
from hpcpipe.fsutil import fsync_dir

HASHES = ("sha256", "blake3")  # the manifest's per-file key is the algorithm's name
HASH_LABELS = {"sha256": "SHA-256", "blake3": "BLAKE3"}
MANIFEST_NAME = "manifest.json"
FORMAT = "hpcpipe-checkpoint/1"
ENGINES = ("dcp", "deepspeed")
TENSOR_FORMATS = ("torch_save", "raw")
STEP_DIR_RE = re.compile(r"^step-(\d{8})$")
_CHUNK = 8 << 20


class CheckpointError(UserError):
    """A checkpoint could not be saved, found or verified: one line naming the path, exit 2."""


class Hasher(Protocol):
    def update(self, data: Any, /) -> object: ...

    def hexdigest(self) -> str: ...


@dataclass(frozen=True)
class FileEntry:
    digest: str  # hex, of the manifest's algorithm
    size: int


def new_hasher(algorithm: str) -> Hasher:
    """A fresh hasher; CheckpointError naming ``checkpoint.hash`` when BLAKE3 is not installed."""
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "blake3":
        try:
            import blake3
        except ImportError:
            raise CheckpointError(
                "checkpoint.hash=blake3 needs the blake3 package: pip install 'hpcpipe[blake3]' "
                "(or set checkpoint.hash=sha256)"
            ) from None
        return blake3.blake3()
    raise CheckpointError(f"checkpoint.hash: unknown algorithm {algorithm!r} (one of {', '.join(HASHES)})")


@dataclass(frozen=True)
class Manifest:
    """What a committed checkpoint promises: its files, and the run state it belongs to."""

    step: int
    world_size: int
    config_hash: str
    files: dict[str, FileEntry]
    created_unix: float = field(default_factory=time.time)
    format: str = FORMAT
    hash: str = "sha256"
    engine: str = "dcp"  # whose files hold model and optimizer: "dcp" or "deepspeed" (deepspeed_io.py)
    # How DCP shard files hold tensors: "raw" (raw_format.py) or DCP's own "torch_save"
    # (checkpoints written before the raw layout; their manifests have no such field).
    tensor_format: str = "torch_save"
    # How the world was split when it was saved ({"dp": 2, "tp": 2, ...}; train/mesh.py); None: not
    # recorded (data parallel only, or written before the field). Loading does not depend on it:
    # DCP reshards into any layout; it is for people and tools reading the checkpoint.
    layout: dict[str, Any] | None = None
    # How the optimizer state is keyed: "nested" (DCP's default: state and param_groups by
    # parameter) or "flat" (every entry by parameter name, param_groups too: what pipeline stages
    # write, each holding different parameters, so that another layout finds its own).
    optimizer_state: str = "nested"

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files.values())

    def to_json(self) -> str:
        body: dict[str, Any] = {
            "format": self.format,
            "step": self.step,
            "world_size": self.world_size,
            "config_hash": self.config_hash,
            "created_unix": self.created_unix,
            "hash": self.hash,
            "files": {name: {self.hash: e.digest, "size": e.size} for name, e in sorted(self.files.items())},
        }
        if self.engine != "dcp":  # DCP manifests stay as they were written before the field
            body["engine"] = self.engine
        if self.tensor_format != "torch_save":
            body["tensor_format"] = self.tensor_format
        if self.layout is not None:
            body["layout"] = self.layout
        if self.optimizer_state != "nested":
            body["optimizer_state"] = self.optimizer_state
        return json.dumps(body, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse and type-check; ValueError/KeyError/TypeError on anything malformed (a number
        out of range, ``1e999``, or nesting too deep for the parser is a ValueError too: as
        OverflowError or RecursionError it crashed resume instead of falling back)."""
        try:
            return cls._from_json(text)
        except (OverflowError, RecursionError) as exc:
            raise ValueError(f"{type(exc).__name__}: {exc}") from None

    @classmethod
    def _from_json(cls, text: str) -> Manifest:
        body = json.loads(text)
        if body.get("format") != FORMAT:
            raise ValueError(f"unknown manifest format {body.get('format')!r}")
        algorithm = body.get("hash", "sha256")  # written before the field existed: SHA-256
        if algorithm not in HASHES:
            raise ValueError(f"unknown hash {algorithm!r}")
        files = {}
        for name, entry in body["files"].items():
            if not _is_safe_relative(name):
                raise ValueError(f"unsafe file name {name!r}")
            files[name] = FileEntry(digest=str(entry[algorithm]), size=int(entry["size"]))
        return cls(
            step=int(body["step"]),
            world_size=int(body["world_size"]),
            config_hash=str(body["config_hash"]),
            files=files,
            created_unix=float(body["created_unix"]),
            hash=algorithm,
            engine=_engine(body.get("engine", "dcp")),
            tensor_format=_tensor_format(body.get("tensor_format", "torch_save")),
            layout=_layout(body.get("layout")),
            optimizer_state=_optimizer_state(body.get("optimizer_state", "nested")),
        )


def _optimizer_state(value: Any) -> str:
    if value not in ("nested", "flat"):
        raise ValueError(f"unknown optimizer_state {value!r}")
    return str(value)


def _layout(value: Any) -> dict[str, Any] | None:
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"layout must be an object, not {type(value).__name__}")
    return value


def _tensor_format(value: Any) -> str:
    if value not in TENSOR_FORMATS:
        raise ValueError(f"unknown tensor_format {value!r}")
    return str(value)


def _engine(value: Any) -> str:
    if value not in ENGINES:
        raise ValueError(f"unknown checkpoint engine {value!r}")
    return str(value)


@dataclass(frozen=True)
class Problem:
    """One reason a checkpoint does not verify, naming the file (relative to the checkpoint)."""

    file: str
    reason: str
    expected: str | None = None
    actual: str | None = None

    def __str__(self) -> str:
        detail = f" (expected {self.expected}, found {self.actual})" if self.expected else ""
        return f"{self.file}: {self.reason}{detail}"

    def to_dict(self) -> dict[str, str | None]:
        return {"file": self.file, "reason": self.reason, "expected": self.expected, "actual": self.actual}


class FileMismatch(CheckpointError):
    """A file read during a restore does not match its manifest entry (``problem`` says how)."""

    def __init__(self, message: str, problem: Problem) -> None:
        super().__init__(message)
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:  # DCP gathers every rank's exceptions with pickle
        return (FileMismatch, (str(self), self.problem))


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def parse_step(name: str) -> int | None:
    """The step of a committed directory name, None for anything else (.tmp-*, .trash-*)."""
    match = STEP_DIR_RE.match(name)
    return int(match.group(1)) if match else None


def hash_file(path: Path, algorithm: str = "sha256") -> FileEntry:
    digest = new_hasher(algorithm)
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return FileEntry(digest=digest.hexdigest(), size=size)


def read_manifest(ckpt_dir: Path) -> Manifest:
    """The manifest of ``ckpt_dir``; CheckpointError naming the file when missing or malformed."""
    found = _manifest_or_problem(ckpt_dir)
    if isinstance(found, Problem):
        raise CheckpointError(f"{ckpt_dir / found.file}: {found.reason}")
    return found


def _manifest_or_problem(ckpt_dir: Path) -> Manifest | Problem:
    try:
        return Manifest.from_json((ckpt_dir / MANIFEST_NAME).read_text())
    except FileNotFoundError:
        return Problem(MANIFEST_NAME, "manifest missing")
    except OSError as exc:
        return Problem(MANIFEST_NAME, f"unreadable ({exc.strerror or exc})")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return Problem(MANIFEST_NAME, f"malformed manifest ({exc})")


def write_manifest(ckpt_dir: Path, manifest: Manifest, sync_dir: bool = True) -> None:
    """Write manifest.json durably (tmp file, fsync, rename, fsync of the directory unless the
    caller fsyncs it next anyway: ``sync_dir=False``)."""
    tmp = ckpt_dir / f".{MANIFEST_NAME}.tmp"
    with tmp.open("w") as handle:
        handle.write(manifest.to_json())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, ckpt_dir / MANIFEST_NAME)
    if sync_dir:
        fsync_dir(ckpt_dir)


def verify_dir(
    ckpt_dir: Path, threads: int = 4, content: bool = True
) -> tuple[Manifest | None, list[Problem]]:
    """Check every file of ``ckpt_dir`` against its manifest; (manifest, problems), [] when good.

    ``content=False`` checks everything but the hashes (names, sizes, no links, nothing
    unlisted): what the store checks before a restore, whose reader hashes while it loads.
    """
    manifest = _manifest_or_problem(ckpt_dir)
    if isinstance(manifest, Problem):
        return None, [manifest]
    problems = [Problem(name, "not listed in the manifest") for name in _unlisted(ckpt_dir, manifest)]
    names = sorted(manifest.files)

    def check(name: str) -> Problem | None:
        return _check_file(ckpt_dir, name, manifest.files[name], manifest.hash, content)

    if not content:  # a stat per file: threads would cost more than they save
        found = [check(name) for name in names]
    else:
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(names) or 1))) as pool:
            found = list(pool.map(check, names))
    problems += [p for p in found if p is not None]
    return manifest, sorted(problems, key=lambda p: p.file)


def _check_file(ckpt_dir: Path, name: str, want: FileEntry, algorithm: str, content: bool) -> Problem | None:
    path = ckpt_dir / name
    if path.is_symlink():  # we never write links; one could point anywhere
        return Problem(name, "is a symbolic link")
    try:
        size = path.stat().st_size
        if size != want.size:
            return Problem(name, "wrong size", f"{want.size} bytes", f"{size} bytes")
        if not content:
            return None
        got = hash_file(path, algorithm)
    except FileNotFoundError:
        return Problem(name, "missing")
    except OSError as exc:
        return Problem(name, f"unreadable ({exc.strerror or exc})")
    return entry_problem(name, want, got, algorithm)


def entry_problem(name: str, want: FileEntry, got: FileEntry, algorithm: str) -> Problem | None:
    """How a file read as ``got`` differs from its manifest entry ``want``; None when it does not."""
    if got.size != want.size:  # (after a stat that matched: changed while we read it)
        return Problem(name, "wrong size", f"{want.size} bytes", f"{got.size} bytes")
    if got.digest != want.digest:
        return Problem(name, f"{HASH_LABELS[algorithm]} mismatch", want.digest, got.digest)
    return None


def check_bytes(name: str, data: bytes, want: FileEntry | None, algorithm: str) -> None:
    """FileMismatch naming ``name`` when ``data`` (a whole file, read once) is not ``want``."""
    if want is None:
        return
    hasher = new_hasher(algorithm)
    hasher.update(data)
    problem = entry_problem(name, want, FileEntry(hasher.hexdigest(), len(data)), algorithm)
    if problem is not None:
        raise FileMismatch(f"{name}: {problem}", problem)


def _unlisted(ckpt_dir: Path, manifest: Manifest) -> Iterable[str]:
    for path in sorted(ckpt_dir.rglob("*")):
        if path.is_file() or path.is_symlink():
            name = path.relative_to(ckpt_dir).as_posix()
            if name != MANIFEST_NAME and name not in manifest.files:
                yield name


def _is_safe_relative(name: str) -> bool:
    """A manifest names files inside the checkpoint only: no absolute paths, no '..', and a name
    the file system can take (a NUL or an unencodable surrogate made stat() raise ValueError,
    which crashed resume instead of falling back)."""
    if "\x00" in name:
        return False
    try:
        os.fsencode(name)
    except UnicodeEncodeError:
        return False
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts
