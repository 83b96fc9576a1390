"""Errors that reach the user as one line and exit code 2 (bad config, data, paths, CLI)."""

from __future__ import annotations

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """Bad input from the user. The CLI prints ``error: <message>`` and exits with code 2.

    Raise it with a message that names the key, file or flag to fix; never for a bug.
    """


class ConfigError(UserError):
    """A JobConfig could not be loaded, overridden or validated."""


class DataError(UserError):
    """A corpus, tokenizer or shard directory is missing, empty or inconsistent."""
