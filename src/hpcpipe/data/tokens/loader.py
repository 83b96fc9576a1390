"""Token windows for training and evaluation, read from memory-mapped shards.

A *window* is ``seq_len + 1`` consecutive tokens inside one shard: window i of a shard covers
tokens ``[i*T, i*T + T + 1)``, so inputs are ``window[:-1]`` and targets ``window[1:]``. Windows are
numbered globally, shard after shard.

The training order over windows is ``hpcpipe.data.order.SampleOrder``, shared with the image
loader: a pure function of (seed, epoch, position), independent of the world size.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcpipe.data.order import SampleOrder, check_batch_arithmetic
from hpcpipe.data.tokens.shards import PreparedDataset, open_dataset
from hpcpipe.errors import DataError


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
            # max: an empty shard's (0 - 1) // T is -1, and starts that go down misroute windows
            counts.append(max(0, (int(entry["tokens"]) - 1) // seq_len))
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
    """Shuffled, rank-sharded, resumable training batches (the order is ``data.order.SampleOrder``).

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
        check_batch_arithmetic(micro_batch_size, global_batch_size, rank, world_size)  # before reading
        self.store = WindowStore(dataset, split, seq_len)
        windows = self.store.num_windows
        self.order = SampleOrder(windows, micro_batch_size, global_batch_size, rank, world_size, seed)

    @property
    def num_windows(self) -> int:
        return self.store.num_windows

    @property
    def step(self) -> int:
        return self.order.step

    @property
    def micro_batch_size(self) -> int:
        return self.order.micro_batch_size

    @property
    def grad_accum_steps(self) -> int:
        return self.order.samples_per_rank // self.order.micro_batch_size

    @property
    def epoch(self) -> float:
        """Fractional epochs consumed at the start of the current step (for logging)."""
        return self.order.epoch

    def next_microbatch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``x, y`` (int64, (micro, seq_len)); y is x shifted left by one token."""
        return self.store.gather(self.order.items(self.order.next_positions()))  # x, y: (micro, T)

    def step_windows(self, step: int) -> np.ndarray:
        """Global window indices of this rank's slice of ``step`` (data-order audits and tests)."""
        return self.order.items(self.order.step_positions(step))

    def rewind_step(self) -> None:
        self.order.rewind_step()

    def set_micro_batch_size(self, micro_batch_size: int) -> None:
        self.order.set_micro_batch_size(micro_batch_size)

    def close(self) -> None:
        """Nothing to release: the shards are memory maps the process drops at exit."""

    def state_dict(self) -> dict[str, int]:
        """Plain ints; the same for every rank at a step boundary (rank is not part of it)."""
        state = self.order.state_dict()
        state["num_windows"] = state.pop("num_items")  # the key checkpoints have always used
        state["seq_len"] = self.store.seq_len
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume exactly; a mid-step state only at the world size and micro-batch it allows."""
        renamed = {**state, "num_items": state.get("num_windows", -1)}
        self.order.load_state_dict(renamed, must_match={"seq_len": self.store.seq_len})


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
