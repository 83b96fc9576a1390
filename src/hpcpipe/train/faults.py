"""The fault injector the trainer calls at fixed points of its loop: a no-op unless a chaos job
installs one (``hpcpipe.train.fault_injection.installed``, from ``HPCPIPE_CHAOS_*`` variables).

The trainer holds one ``FaultInjector`` and knows nothing of faults: it reports where it is
(``at("data" | "forward", step, micro)`` in the loop, ``at_save(point, step)`` inside a checkpoint
save) and an installed injector may sleep, raise, or signal this process there. ``NO_FAULTS``
costs one method call per point.
"""

from __future__ import annotations

from typing import Protocol

# The loop's points: after a micro-batch is fetched (inside the data-wait time), and at the end of
# a micro-step's forward (inside the OOM guard, after the model's collectives).
LOOP_POINTS = ("data", "forward", "backward")


class FaultInjector(Protocol):
    def at(self, point: str, step: int, micro: int) -> None:
        """The loop reached ``point`` (one of LOOP_POINTS) of micro-step ``micro`` of ``step``."""

    def at_save(self, point: str, step: int) -> None:
        """The checkpoint save of ``step`` reached ``point`` (``shards`` or ``manifest``)."""


class NoFaults:
    """The injector of every run that is not a chaos trial: nothing happens anywhere."""

    def at(self, point: str, step: int, micro: int) -> None:
        pass

    def at_save(self, point: str, step: int) -> None:
        pass


NO_FAULTS = NoFaults()
