"""A recipe module with a bug at import: its author must see the traceback."""

RESULT = 1 / 0
