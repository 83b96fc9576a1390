"""Files of function-calling rows -> ``Conversation`` list; the held-out split and the malformed-row report.

A source file is JSON lines, or one JSON array (``read_conversations``). Each row goes through its
format's parser (:mod:`hpcpipe.data.function_calling.formats`); a row that cannot become a
conversation is counted by its ``MalformedRow`` reason, so a dirty public dump costs rows, not the
run. Only a missing or unreadable file is an error.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpcpipe.config.data import FunctionCallingFormat
from hpcpipe.data.function_calling.conversation import Conversation
from hpcpipe.data.function_calling.formats import PARSERS, MalformedRow, Parser
from hpcpipe.errors import DataError

Format = FunctionCallingFormat

_NOT_JSON = object()  # a line that does not decode


def read_conversations(paths: Sequence[Path], fmt: Format) -> tuple[list[Conversation], Counter[str]]:
    """Conversations of JSONL files (or JSON array files) and malformed rows counted by reason.

    A conversation's ``source`` is ``<file name>:<line>`` (in an array file: the 1-based element).
    Only a missing or unreadable file is an error: a bad row is one count, never the end of a run.
    """
    parse = PARSERS.get(fmt)
    if parse is None:
        raise DataError(f"data.format: unknown function-calling format {fmt!r} (glaive, openai or hermes)")
    convs: list[Conversation] = []
    bad: Counter[str] = Counter()
    for path in paths:
        for line, row in _read_rows(Path(path)):
            try:
                conv = _parse_row(parse, row)
            except MalformedRow as exc:
                bad[exc.reason] += 1
                continue
            convs.append(replace(conv, source=f"{path.name}:{line}"))
    return convs, bad


def _parse_row(parse: Parser, row: Any) -> Conversation:
    if row is _NOT_JSON:
        raise MalformedRow("bad_json", "the line is not JSON")
    try:
        conv = parse(row)
        conv.key().encode("utf-8")  # all its text: held_out and the tokenizer encode it
        return conv
    except MalformedRow:
        raise
    except UnicodeEncodeError:  # before ValueError, its base class
        # A lone surrogate escape ("\ud800") is legal JSON, but no text: counted, as bad JSON is.
        raise MalformedRow("bad_json", "a string holds a lone surrogate escape, not text") from None
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
        # Backstop: a row shape nobody foresaw is still one counted row, never a crashed run.
        raise MalformedRow("unparseable", f"{type(exc).__name__}: {exc}") from exc


def _read_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, decoded row or ``_NOT_JSON``) for each non-blank line, or each array element."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4096).lstrip(b"\xef\xbb\xbf").lstrip()
            fh.seek(0)
            if head.startswith(b"["):
                yield from _array_rows(fh.read())
                return
            for number, raw in enumerate(fh, start=1):
                if raw.strip():
                    yield number, _decode_line(raw)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def _array_rows(data: bytes) -> Iterator[tuple[int, Any]]:
    try:
        rows = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        rows = None
    if isinstance(rows, list):
        yield from enumerate(rows, start=1)
        return
    # Not one JSON array after all (e.g. JSONL whose lines are arrays): read it line by line.
    for number, raw in enumerate(data.splitlines(), start=1):
        if raw.strip():
            yield number, _decode_line(raw)


def _decode_line(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return _NOT_JSON


# ---------------------------------------------------------------------------------------------- split, report


def held_out(conv: Conversation, fraction: float, seed: int) -> bool:
    """Whether ``conv`` is held out for evaluation: a hash of its content, not of its position.

    The same conversation lands on the same side on every machine, run and file order, and a
    duplicate row can never sit on both sides.
    """
    if fraction <= 0:
        return False
    if fraction >= 1:
        return True
    digest = hashlib.sha256(f"{seed}:{conv.key()}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2.0**64


def write_malformed_report(counts: Counter[str], total: int, path: Path) -> None:
    """``{"total_rows", "valid_rows", "malformed_rows", "malformed": {reason: count}}`` (reasons sorted)."""
    malformed = {reason: n for reason, n in sorted(counts.items()) if n > 0}
    bad = sum(malformed.values())
    report = {"total_rows": total, "valid_rows": total - bad, "malformed_rows": bad, "malformed": malformed}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
