"""The trainer's regions that are no training step (no imports: the CLI reads them without torch)."""

from __future__ import annotations

LONG_PHASES = ("evaluate", "checkpoint_save")
"""Regions that are no training step: the stall alert waits for them, traces leave them out."""

ANNOTATION = "hpcpipe::{phase}"
"""How a trace names a long phase inside the profiled window (``record_function``)."""
