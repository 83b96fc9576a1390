"""Token windows for training and evaluation, read from memory-mapped shards.

A *window* is ``seq_len + 1`` consecutive tokens inside one shard: window i of a shard covers
tokens ``[i*T, i*T + T + 1)``, so inputs are ``window[:-1]`` and targets ``window[1:]``. Windows are
numbered globally, shard after shard.

The training order is a pure function of the seed: epoch e visits windows in
``default_rng([seed, e]).permutation(num_windows)``; global sample g is window
``perm_{g // N}[g % N]``. Optimizer step s consumes global samples ``[s*G, (s+1)*G)`` and rank r
takes the contiguous ``G/W`` of them starting at ``s*G + r*G/W``. Because the global sample order
does not depend on the world size W, a loader state saved at a step boundary resumes exactly at
any other world size, and the union of all ranks' samples for a step is the same as one rank's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcpipe.data.shards import PreparedDataset, open_dataset
from hpcpipe.errors import ConfigError, DataError

_STATE_VERSION = 1


class WindowStore:
    """The windows of one split: shards opened once as read-only memmaps."""

    def __init__(self, dataset: Path | PreparedDataset, split: str, seq_len: int) -> None:
        if seq_len < 1:
            raise ValueError("seq_len must be >= 1")
        ds = dataset if isinstance(dataset, PreparedDataset) else open_dataset(dataset)
        self.seq_len = seq_len
        self._shards: list[np.ndarray] = []  # read-only memmaps, one per shard
        counts: list[int] = []
        for entry, path in zip(ds.shards(split), ds.shard_paths(split), strict=True):
            self._shards.append(_open_shard(path, ds.dtype, int(entry["tokens"])))
            counts.append((int(entry["tokens"]) - 1) // seq_len)
        # first global window index of each shard, plus the total at the end
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self.num_windows = int(self._starts[-1])
        if self.num_windows == 0:
            longest = max((int(entry["tokens"]) for entry in ds.shards(split)), default=0)
            raise DataError(
                f"{ds.path}: the {split!r} split has {ds.tokens(split)} tokens (at most {longest} in "
                f"one shard), fewer than one window of model.seq_len + 1 = {seq_len + 1} tokens"
            )

    def gather(self, windows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets for global window indices: two int64 tensors (len(windows), T)."""
        T = self.seq_len
        buf = np.empty((len(windows), T + 1), dtype=np.int64)  # (B, T+1)
        shard_ids = np.searchsorted(self._starts, windows, side="right") - 1
        for row, (window, shard) in enumerate(zip(windows.tolist(), shard_ids.tolist(), strict=True)):
            start = (window - int(self._starts[shard])) * T
            buf[row] = self._shards[shard][start : start + T + 1]
        tokens = torch.from_numpy(buf)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # x, y: (B, T)


def _open_shard(path: Path, dtype: np.dtype[Any], tokens: int) -> np.ndarray:
    """A read-only memmap of a shard whose size must match the manifest (truncation check)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise DataError(f"{path}: shard missing") from None
    if size != tokens * dtype.itemsize:
        raise DataError(f"{path}: shard is {size} bytes, the manifest says {tokens * dtype.itemsize}")
    if tokens == 0:  # mmap cannot map an empty file; an empty shard has no windows anyway
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(tokens,))


class TokenWindowLoader:
    """Shuffled, rank-sharded, resumable training batches (see the module docstring for the order).

    ``next_microbatch()`` serves this rank's slice of the current optimizer step in micro-batches
    of ``micro_batch_size`` windows and then moves on to the next step by itself, so the trainer
    calls it ``grad_accum_steps`` times per step.
    """

    def __init__(
        self,
        dataset: Path | PreparedDataset,
        split: str,
        seq_len: int,
        micro_batch_size: int,
        global_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        per_rank = global_batch_size // world_size
        if global_batch_size % (micro_batch_size * world_size) != 0:
            raise ConfigError(
                f"train.global_batch_size ({global_batch_size}) must be a multiple of "
                f"train.micro_batch_size ({micro_batch_size}) x world size ({world_size})"
            )
        self.store = WindowStore(dataset, split, seq_len)
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.global_batch_size = global_batch_size
        self.samples_per_rank = per_rank  # this rank's share of one optimizer step
        self.micro_batch_size = micro_batch_size
        self.step = 0  # the optimizer step being served
        self.offset = 0  # samples of this rank's slice already served in that step
        self._perms: dict[int, np.ndarray] = {}

    @property
    def num_windows(self) -> int:
        return self.store.num_windows

    @property
    def grad_accum_steps(self) -> int:
        return self.samples_per_rank // self.micro_batch_size

    @property
    def epoch(self) -> float:
        """Fractional epochs consumed at the start of the current step (for logging)."""
        return self.step * self.global_batch_size / self.num_windows

    def next_microbatch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``x, y`` (int64, (micro, seq_len)); y is x shifted left by one token."""
        first = self.step * self.global_batch_size + self.rank * self.samples_per_rank + self.offset
        samples = np.arange(first, first + self.micro_batch_size, dtype=np.int64)
        batch = self.store.gather(self._windows(samples))  # x, y: (micro, T)
        self.offset += self.micro_batch_size
        if self.offset == self.samples_per_rank:
            self.step, self.offset = self.step + 1, 0
        return batch

    def step_windows(self, step: int) -> np.ndarray:
        """Global window indices of this rank's slice of ``step`` (data-order audits and tests)."""
        first = step * self.global_batch_size + self.rank * self.samples_per_rank
        return self._windows(np.arange(first, first + self.samples_per_rank, dtype=np.int64))

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
            "num_windows": self.num_windows,
            "seq_len": self.store.seq_len,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume exactly; a mid-step state only at the world size and micro-batch it allows."""
        for key in ("seed", "global_batch_size", "num_windows", "seq_len"):
            mine = self.state_dict()[key]
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

    def _windows(self, samples: np.ndarray) -> np.ndarray:
        """Global sample indices -> global window indices (the epoch permutations)."""
        n = self.num_windows
        epochs, positions = np.divmod(samples, n)
        windows = np.empty_like(samples)
        for epoch in np.unique(epochs).tolist():
            mask = epochs == epoch
            windows[mask] = self._permutation(epoch)[positions[mask]]
        return windows

    def _permutation(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_windows)
            # keep the current and the next epoch only: a batch spans at most a boundary
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
            self._perms[epoch] = perm
        return perm


class EvalWindows:
    """The first ``n_batches * micro * world`` windows of a split, unshuffled, sharded by rank.

    Every evaluation sees the same windows, so validation losses are comparable across steps and
    runs. Rank r takes a contiguous block; a split smaller than needed is reused from its start so
    every rank still runs ``n_batches`` batches (ranks must agree on the count for collectives).
    """

    def __init__(
        self,
        dataset: Path | PreparedDataset,
        split: str,
        seq_len: int,
        micro_batch_size: int,
        n_batches: int,
        rank: int,
        world_size: int,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.store = WindowStore(dataset, split, seq_len)
        self.micro_batch_size, self.n_batches = micro_batch_size, n_batches
        per_rank = n_batches * micro_batch_size
        self._windows = (rank * per_rank + np.arange(per_rank, dtype=np.int64)) % self.store.num_windows

    def __len__(self) -> int:
        return self.n_batches

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``x, y`` int64 tensors (micro, seq_len), ``n_batches`` of them."""
        micro = self.micro_batch_size
        for i in range(self.n_batches):
            yield self.store.gather(self._windows[i * micro : (i + 1) * micro])
