"""The training sample order shared by every loader: a pure function of (seed, epoch, position).

Item i of a dataset of N items is a window of tokens or an image. Epoch e visits the items in
``default_rng([seed, e]).permutation(N)``; the global *position* g is item ``perm_{g // N}[g % N]``.
Optimizer step s consumes positions ``[s*G, (s+1)*G)`` and rank r takes the contiguous ``G/W`` of
them starting at ``s*G + r*G/W``, served in micro-batches.

Consequences the tests pin down:
- within an epoch (positions ``[e*N, (e+1)*N)``) every item is served exactly once over all
  ranks: nothing duplicated, nothing dropped;
- the global order does not depend on the world size W, so a state saved at a step boundary
  resumes exactly at another world size, and the union of the ranks' slices equals one rank's;
- the state is two integers (step, offset) plus what must match (seed, N, G): a DataLoader with
  worker processes restarts from it without replaying anything.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcpipe.errors import ConfigError, DataError

_STATE_VERSION = 1


def check_batch_arithmetic(micro_batch_size: int, global_batch_size: int, rank: int, world_size: int) -> None:
    """ValueError for a rank outside the group; ConfigError when the global batch does not split."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    if global_batch_size % (micro_batch_size * world_size) != 0:
        raise ConfigError(
            f"train.global_batch_size ({global_batch_size}) must be a multiple of "
            f"train.micro_batch_size ({micro_batch_size}) x world size ({world_size})"
        )


class SampleOrder:
    """Which global positions and items this rank serves next; resumable from ``state_dict``."""

    def __init__(
        self,
        num_items: int,
        micro_batch_size: int,
        global_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
    ) -> None:
        check_batch_arithmetic(micro_batch_size, global_batch_size, rank, world_size)
        self.num_items = num_items
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.global_batch_size = global_batch_size
        self.samples_per_rank = global_batch_size // world_size  # this rank's share of one step
        self.micro_batch_size = micro_batch_size
        self.step = 0  # the optimizer step being served
        self.offset = 0  # samples of this rank's slice already served in that step
        self._perms: dict[int, np.ndarray] = {}

    @property
    def epoch(self) -> float:
        """Fractional epochs consumed at the start of the current step."""
        return self.step * self.global_batch_size / self.num_items

    def next_positions(self) -> np.ndarray:
        """Global positions (int64, (micro,)) of the next micro-batch; advances the state."""
        first = self.step * self.global_batch_size + self.rank * self.samples_per_rank + self.offset
        positions = np.arange(first, first + self.micro_batch_size, dtype=np.int64)
        self.offset += self.micro_batch_size
        if self.offset == self.samples_per_rank:
            self.step, self.offset = self.step + 1, 0
        return positions

    def step_positions(self, step: int) -> np.ndarray:
        """Global positions of this rank's whole slice of ``step``."""
        first = step * self.global_batch_size + self.rank * self.samples_per_rank
        return np.arange(first, first + self.samples_per_rank, dtype=np.int64)

    def items(self, positions: np.ndarray) -> np.ndarray:
        """Global positions -> item indices (the epoch permutations)."""
        n = self.num_items
        epochs, within = np.divmod(positions, n)
        items = np.empty_like(positions)
        for epoch in np.unique(epochs).tolist():
            mask = epochs == epoch
            items[mask] = self._permutation(epoch)[within[mask]]
        return items

    def epoch_end_step(self) -> int:
        """The first step boundary at or after the end of the epoch the current step starts in."""
        epoch_end = (self.step * self.global_batch_size // self.num_items + 1) * self.num_items
        return -(-epoch_end // self.global_batch_size)

    def rewind_step(self) -> None:
        """Serve the current step's slice again from its start (OOM recovery retries a step)."""
        self.offset = 0

    def set_micro_batch_size(self, micro_batch_size: int) -> None:
        """Split the same rank slice into micro-batches of a new size (OOM recovery)."""
        if micro_batch_size < 1 or self.samples_per_rank % micro_batch_size != 0:
            raise ConfigError(
                f"micro-batch size {micro_batch_size} must divide this rank's {self.samples_per_rank} "
                "samples per step (train.global_batch_size / world size)"
            )
        if self.offset % micro_batch_size != 0:
            raise ConfigError(
                f"cannot switch to micro-batch size {micro_batch_size} after {self.offset} samples "
                "of the step; call rewind_step() first"
            )
        self.micro_batch_size = micro_batch_size

    def state_dict(self) -> dict[str, int]:
        """Plain ints; the same for every rank at a step boundary (rank is not part of it)."""
        return {
            "version": _STATE_VERSION,
            "step": self.step,
            "offset": self.offset,
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
            "num_items": self.num_items,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any], must_match: dict[str, int] | None = None) -> None:
        """Resume exactly; a mid-step state only at the world size and micro-batch it allows."""
        wanted = {
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
            "num_items": self.num_items,
            **(must_match or {}),
        }
        for key, mine in wanted.items():
            if int(state.get(key, -1)) != mine:
                raise DataError(f"data loader state: {key} is {state.get(key)}, this run has {mine}")
        offset = int(state["offset"])
        if offset and int(state["world_size"]) != self.world_size:
            raise DataError(
                f"data loader state was saved mid-step (offset {offset}) at world size "
                f"{state['world_size']}; it can only resume at world size {self.world_size} from a "
                "step boundary"
            )
        if offset % self.micro_batch_size != 0 or offset >= self.samples_per_rank:
            raise DataError(
                f"data loader state: offset {offset} does not fit micro-batches of "
                f"{self.micro_batch_size} in {self.samples_per_rank} samples per rank"
            )
        self.step, self.offset = int(state["step"]), offset

    def _permutation(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_items)
            # keep the current and the next epoch only: a batch spans at most a boundary
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
            self._perms[epoch] = perm
        return perm
