"""Chaos engineering: faults injected into real workers, so recovery is tested, not assumed.

The trainer sees faults only through the ``FaultInjector`` it is handed
(``hpcpipe.train.faults``); the worker builds it with ``hpcpipe.train.fault_injection.installed``
from the ``HPCPIPE_CHAOS_*`` environment variables documented there (the trainer's room: the
training code never imports upward). This package re-exports the parsing and injection names.
"""

from __future__ import annotations

from hpcpipe.train.fault_injection import (
    ChaosConfigError,
    Fault,
    active,
    configure,
    maybe_inject,
    parse_faults,
)

__all__ = ["ChaosConfigError", "Fault", "active", "configure", "maybe_inject", "parse_faults"]
