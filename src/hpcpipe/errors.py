"""Errors that reach the user as one line and exit code 2 (bad config, data, paths, CLI)."""

from __future__ import annotations

import re

USER_ERROR_EXIT_CODE = 2
_USERINFO = re.compile(r"//[^/\s@'\"]+@")  # user:password@ in a URL


def hide_credentials(text: str) -> str:
    """``text`` with every URL's ``user:password@`` removed: for messages, logs and artifacts."""
    return _USERINFO.sub("//", text)


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
