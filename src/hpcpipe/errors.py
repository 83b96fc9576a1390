"""Errors that reach the user as one line and exit code 2 (bad config, data, paths, CLI)."""

from __future__ import annotations

import contextlib
import errno
import itertools
import re
from collections.abc import Iterable, Iterator
from typing import NamedTuple

USER_ERROR_EXIT_CODE = 2
"""Bad input: a config key, a flag, a path or data the user gave. One line names what to fix; nothing
committed is changed."""
_USERINFO = re.compile(r"//[^/\s@'\"]+@")  # user:password@ in a URL
# a secret's value in a query string or key=value text: ?access_token=..., X-Amz-Signature=...
_SECRET_VALUE = re.compile(
    r"(?i)\b([\w.-]*(?:token|secret|passw(?:or)?d|api[_-]?key|signature|credential)|sig|auth|pwd)=[^&\s'\"]+"
)
_BEARER = re.compile(r"(?i)\bbearer\s+[\w.~+/-]+=*")  # an Authorization header's token


def hide_credentials(text: str) -> str:
    """``text`` with every URL's ``user:password@`` removed, and the values of secrets it names
    (``token=``, ``password=``, ``api_key=``, a signature, ``Bearer ...``) replaced by ``***``:
    for messages, logs, artifacts and anything sent off the machine (trace spans)."""
    text = _USERINFO.sub("//", text)
    text = _SECRET_VALUE.sub(r"\1=***", text)
    return _BEARER.sub("Bearer ***", text)


def stable_repr(value: object, limit: int = 200) -> str:
    """``repr(value)``, the same in every process: a set's members sorted (iterating a set of
    strings follows the hash seed, ``PYTHONHASHSEED``, so a YAML ``!!set`` quoted in an error would
    read differently from run to run), inside lists, tuples and dicts too. At most about ``limit``
    characters, and the walk stops there: a YAML alias bomb quoted whole was a 35 MB error line
    (and minutes), a self-referencing alias a RecursionError."""
    budget = [limit]
    text = _bounded_repr(value, budget, depth=0)
    return text if budget[0] >= 0 else text[:limit] + "..."


def _bounded_repr(value: object, budget: list[int], depth: int) -> str:
    if budget[0] < 0 or depth > 8:
        budget[0] = -1
        return "..."

    def items(parts: Iterable[object]) -> str:
        shown = []
        for part in parts:
            shown.append(_bounded_repr(part, budget, depth + 1))
            if budget[0] < 0:
                break
        return ", ".join(shown)

    if isinstance(value, set | frozenset) and value:
        members = (
            "{"
            + ", ".join(sorted(_bounded_repr(m, budget, depth + 1) for m in itertools.islice(value, 64)))
            + "}"
        )
        text = members if isinstance(value, set) else f"frozenset({members})"
    elif type(value) is list:
        text = "[" + items(value) + "]"
    elif type(value) is tuple:
        text = "(" + items(value) + ("," if len(value) == 1 else "") + ")"
    elif type(value) is dict:
        pairs = (_Pair(k, v) for k, v in value.items())
        text = "{" + items(pairs) + "}"
    elif isinstance(value, _Pair):
        text = f"{_bounded_repr(value.key, budget, depth)}: {_bounded_repr(value.value, budget, depth)}"
    else:
        text = repr(value)[: max(budget[0], 0) + 1]
    budget[0] -= len(text) if not isinstance(value, list | tuple | dict | set | frozenset | _Pair) else 2
    return text


class _Pair(NamedTuple):
    key: object
    value: object


def one_line(text: str) -> str:
    """``text`` with its line breaks escaped: an error is one line, whatever path or name it quotes."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


class UserError(Exception):
    """Bad input from the user. The CLI prints ``error: <message>`` and exits with code 2.

    Raise it with a message that names the key, file or flag to fix; never for a bug.
    """


class ConfigError(UserError):
    """A JobConfig could not be loaded, overridden or validated."""


class DataError(UserError):
    """A corpus, tokenizer or shard directory is missing, empty or inconsistent."""


# OSErrors that name a path the user can fix: a file where a folder is due (or the reverse), a
# folder that cannot be created under its parent, a name taken, no permission.
_PATH_ERRORS = (NotADirectoryError, IsADirectoryError, FileExistsError, FileNotFoundError, PermissionError)


def path_error(exc: BaseException) -> UserError | None:
    """The one-line UserError for an OSError about a path (``exc.filename`` set), else None.

    Paths come from the user (run.out_dir, checkpoint.dir, data.prepared_dir, --out, ...): a
    checkpoint.dir that is a file must read ``error: cfg.yaml: Not a directory`` and exit 2, not
    end in a traceback deep inside the store."""
    if not isinstance(exc, OSError) or not exc.filename:
        return None
    if not isinstance(exc, _PATH_ERRORS) and exc.errno not in (errno.ENAMETOOLONG, errno.ELOOP):
        return None
    where = str(exc.filename) + (f" -> {exc.filename2}" if exc.filename2 else "")
    return UserError(f"{where}: {exc.strerror or type(exc).__name__}")


@contextlib.contextmanager
def paths_are_input() -> Iterator[None]:
    """Within the block (a worker's set-up: data, the run's folders, the checkpoint store), an
    OSError about a path is the user's (``path_error``); later, mid-training, it keeps its
    traceback (a file that vanished under a running job is not a typo)."""
    try:
        yield
    except OSError as exc:
        if (error := path_error(exc)) is None:
            raise
        raise error from None
