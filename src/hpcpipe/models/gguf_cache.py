"""A GGUF base model de-quantised once, then read back as safetensors.

transformers de-quantises a GGUF file in Python on every ``from_pretrained``: SmolLM2-135M's 98 MB
Q4_1 file costs 15 s of CPU per load and its tokenizer 3.4 s more (measured on 2 cores), paid by
every rank, every restart, every evaluation and every export. The first load here keeps what it
built under ``models/gguf-<hash>/`` of the machine cache (``fsutil.machine_cache_dir``, as the
pre-trained ``@tiny-llama``; ``<data.prepared_dir>/models/`` where that cache is off): the model
as the fp32 weights GGUF de-quantises to, and the tokenizer, keyed by the file's content and the
transformers version, so every run, prepared directory and evaluation on the machine shares one
copy. Later loads read that directory in about a second and cast to the dtype they need. The
GGUF file stays the source of truth: a changed file has another hash. ``HPCPIPE_GGUF_CACHE=0``
loads the file every time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcpipe.fsutil import atomic_replace_dir, machine_cache_dir

_COMPLETE = {"model": "config.json", "tokenizer": "tokenizer_config.json"}


def kept_root(fallback: Path | None) -> Path | None:
    """Where de-quantised copies are kept: the machine cache's ``models/``, else ``fallback``
    (a prepared directory's ``models/``; None: not kept) where ``HPCPIPE_CACHE_DIR=`` turns the
    machine cache off."""
    machine = machine_cache_dir()
    return machine / "models" if machine is not None else fallback


def cached_load(
    gguf: Path,
    cache_root: Path | None,
    part: str,
    load_file: Callable[[], Any],
    load_dir: Callable[[Path], Any],
    save: Callable[[Any, Path], None] | None = None,
) -> Any:
    """``load_dir(entry)`` when ``part`` ("model" or "tokenizer") of ``gguf``
    is kept under ``cache_root``; else ``load_file()``, keeping what it returns there with
    ``save(loaded, directory)`` (default: its ``save_pretrained``). Best effort: a full or
    read-only disk costs only the next load's time."""
    entry = _entry(gguf, cache_root, part)
    if entry is None:
        return load_file()
    if _complete(entry, part):
        return load_dir(entry)
    loaded = load_file()
    with contextlib.suppress(OSError), atomic_replace_dir(entry) as tmp:
        (save or _save_pretrained)(loaded, tmp)
    return loaded


def kept_copy(gguf: Path, cache_root: Path | None, part: str) -> Path | None:
    """The complete kept copy of ``part`` of ``gguf`` under ``cache_root``, or None (not kept yet,
    or caching off): what reads only the model's config can take it from there instead of parsing
    the GGUF file's metadata (about 10 s of CPU for SmolLM2's 49k-token vocabulary)."""
    entry = _entry(gguf, cache_root, part)
    return entry if entry is not None and _complete(entry, part) else None


def _complete(entry: Path, part: str) -> bool:
    return (entry / _COMPLETE[part]).is_file()


def _save_pretrained(loaded: Any, out: Path) -> None:
    loaded.save_pretrained(out)


def _entry(gguf: Path, cache_root: Path | None, part: str) -> Path | None:
    if cache_root is None or os.environ.get("HPCPIPE_GGUF_CACHE", "1") == "0":
        return None
    try:
        stat = gguf.stat()
    except OSError:
        return None  # from_pretrained names the missing file
    return cache_root / f"gguf-{_content_key(str(gguf.resolve()), stat.st_size, stat.st_mtime_ns)}" / part


@functools.cache
def _content_key(path: str, size: int, mtime_ns: int) -> str:
    """The file's content hash (once per process and file version) and the transformers version:
    another release may de-quantise differently."""
    import transformers

    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256")
    digest.update(f"\0transformers {transformers.__version__}".encode())
    return digest.hexdigest()[:20]
