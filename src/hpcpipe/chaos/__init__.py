"""Chaos engineering: faults injected into real workers, so recovery is tested, not assumed.

``maybe_inject`` is the one call the trainer makes. It lives in ``hpcpipe.train.fault_injection``
(the trainer's room: the training code never imports upward), which documents the
``HPCPIPE_CHAOS_*`` environment variables that configure it; this package re-exports it.
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
