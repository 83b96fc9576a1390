"""The acceptance suite: a thresholds file -> measurements -> PASS/FAIL rows -> JSON + Markdown."""
