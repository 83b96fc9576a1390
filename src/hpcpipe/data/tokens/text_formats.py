"""Documents of the file formats beyond plain text and text JSON lines: Parquet (a text column)
and chat JSON lines (a conversation per line, rendered with the model's chat template).

Both read through the ``datasets`` library's local loaders (``Dataset.from_parquet`` /
``from_json``; the ``hf`` extra), with their Arrow cache in a temporary directory that is removed
after: nothing is written beside the user's files or into ``~/.cache``. A file that is not what
its format says, lacks the field, or holds a conversation the template refuses is a DataError
naming the file (and the row or line).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hpcpipe.errors import DataError

# A chat renderer: a conversation (list of {role, content}) -> the text the model is trained on.
Render = Callable[[list[dict[str, Any]]], str]


def parquet_texts(path: Path, column: str) -> Iterator[tuple[int, str]]:
    """(row, text) of ``column`` of a Parquet file, in order; empty and null texts included as ""."""
    rows = _load("parquet", path)
    if column not in rows.column_names:
        known = ", ".join(rows.column_names)
        raise DataError(f"{path}: no column {column!r} (data.text_field; its columns: {known})")
    for row, value in enumerate(rows[column]):
        if value is not None and not isinstance(value, str):
            raise DataError(f"{path}: row {row}: column {column!r} is not text")
        yield row, value or ""


def chat_texts(path: Path, field: str, render: Render | None) -> Iterator[tuple[int, str]]:
    """(line, rendered conversation) of a chat JSON-lines file, in order."""
    if render is None:
        raise DataError(f"{path}: data.format chat needs a recipe with a chat template (hf-causal-lm)")
    rows = _load("json", path)
    if field not in rows.column_names:
        raise DataError(f"{path}: no {field!r} field (data.messages_field)")
    for row, messages in enumerate(rows[field]):
        where = f"{path}:{row + 1}"
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: {field!r} is not a list of messages")
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise DataError(f"{where}: a message without a role (each is {{role, content}})")
        try:
            yield row + 1, render(messages)
        except Exception as exc:  # jinja2's TemplateError, or the template's own raise_exception
            raise DataError(f"{where}: the chat template refused the conversation ({exc})") from None


def _load(kind: str, path: Path) -> Any:
    """The whole file as a ``datasets.Dataset`` in memory (its Arrow cache in a temporary dir)."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"{path}: reading it needs the datasets package: pip install 'hpcpipe[hf]'") from None
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="hpcpipe-datasets-") as cache:
        try:
            if kind == "parquet":
                return datasets.Dataset.from_parquet(str(path), cache_dir=cache, keep_in_memory=True)
            return datasets.Dataset.from_json(str(path), cache_dir=cache, keep_in_memory=True)
        except Exception as exc:  # pyarrow's ArrowInvalid, datasets' DatasetGenerationError, ...
            cause = str(exc.__cause__ or exc).strip().splitlines() or [type(exc).__name__]
            raise DataError(f"{path}: not a readable {kind} file ({cause[0]})") from None
