"""Chaos engineering: faults injected into real workers, so recovery is tested, not assumed.

``maybe_inject`` is the one call the trainer makes; ``hpcpipe.chaos.inject`` documents the
``HPCPIPE_CHAOS_*`` environment variables that configure it.
"""

from __future__ import annotations

from hpcpipe.chaos.inject import ChaosConfigError, Fault, active, configure, maybe_inject, parse_faults

__all__ = ["ChaosConfigError", "Fault", "active", "configure", "maybe_inject", "parse_faults"]
