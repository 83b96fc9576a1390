"""A recipe module with a bug at import: its author is told what and where, in one line."""

RESULT = 1 / 0
