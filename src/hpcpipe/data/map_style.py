"""Batches of a map-style dataset (``torch.utils.data.Dataset``): rank-sharded, resumable,
deterministic. The loader of ``hpcpipe.DatasetRecipe`` (over a user's dataset) and of the image
pipeline.

- **Order**: ``data/order.py SampleOrder``, a pure function of (seed, epoch, position): the same
  (seed, step, rank) gives the same micro-batch, a restart replays nothing, and the global order
  does not depend on the world size, so a state saved at a step boundary resumes at another one.
- **Randomness inside ``__getitem__``** (an augmentation drawing from torch's global generator):
  each sample is fetched with torch's default generator seeded from (seed, position), and the
  generator's state put back after (4 µs a sample, measured; ``torch.random.fork_rng`` takes
  170), so a sample is the same whichever DataLoader worker fetches it and whatever ran before,
  and the trainer's own stream (dropout) is untouched. NumPy's and Python's global generators are
  not seeded: draw from torch's.
- **Workers**: one torch ``DataLoader`` for the run (``data.num_workers``, ``pin_memory``,
  ``persistent_workers``, ``prefetch_factor``), whose batch sampler starts each iterator exactly
  where training stands (an epoch, a resume, an OOM shrink).
- **Evaluation**: the split in contiguous blocks per rank, unshuffled; every rank runs the same
  number of batches (FSDP2 gathers parameters in every forward), and a rank that has run out
  runs a ``PaddingBatch`` whose figures the trainer discards: nothing counted twice or left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from hpcpipe.config import DataConfig
from hpcpipe.data.order import SampleOrder
from hpcpipe.errors import DataError, UserError
from hpcpipe.recipes.base import Batch, PaddingBatch

_MASK64 = (1 << 64) - 1
Collate = Callable[[list[Any]], Batch]


def mix64(seed: int, position: int) -> int:
    """SplitMix64 of (seed, position): 64 well-mixed random bits, a pure function of both."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def collate_tuple(items: list[Any]) -> Batch:
    """torch's ``default_collate``, as the tuple of tensors the trainer moves to the device: a
    dataset item is a tuple of tensors or numbers (or one tensor). Any other item (a dict, a
    string) is a DataError saying so: it failed deep in the trainer, blamed on the recipe."""
    batch = default_collate(items)
    batch = tuple(batch) if isinstance(batch, list | tuple) else (batch,)
    for part in batch:
        if not isinstance(part, torch.Tensor):
            raise DataError(
                f"a dataset item collates to {type(part).__name__}, not tensors: return a tuple of "
                "tensors or numbers from __getitem__ (x, y), or write the recipe's collate() to make one"
            )
    return batch


class SeededSamples(Dataset[Any]):
    """``samples[(item, position)]`` -> ``dataset[item]``, with torch's generator seeded from
    (seed, position) while it is read."""

    def __init__(self, dataset: Any, seed: int) -> None:  # a map-style dataset
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        item, position = key
        generator = torch.default_generator
        saved = generator.get_state()
        generator.manual_seed(mix64(self.seed, position) & ((1 << 63) - 1))
        try:
            return self.dataset[item]
        finally:
            generator.set_state(saved)


class _WorkerUserError:
    """A UserError raised in a DataLoader worker, sent back in place of its batch: torch re-raises
    a worker's exception with the worker's whole traceback as its message, so an undecodable
    image ended the run with that text instead of the one line naming the file."""

    def __init__(self, exc: UserError) -> None:
        self.kind, self.message = type(exc), str(exc)

    def reraise(self) -> NoReturn:
        try:
            error = self.kind(self.message)
        except Exception:  # a subclass that takes other arguments
            error = UserError(self.message)
        raise error


class _UserErrorsAsData(Dataset[Any]):
    """``samples`` in a worker process: an item whose read raises a UserError is its message."""

    def __init__(self, samples: Dataset[Any]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)  # type: ignore[arg-type]

    def __getitem__(self, key: Any) -> Any:
        try:
            return self.samples[key]
        except UserError as exc:
            return _WorkerUserError(exc)


class _CollateUserErrors:
    """``collate`` in a worker process: a batch with a failed item, or whose collate raises a
    UserError, is that message (a class, not a closure: workers may be spawned, not forked)."""

    def __init__(self, collate: Collate) -> None:
        self.collate = collate

    def __call__(self, items: list[Any]) -> Any:
        failed = next((item for item in items if isinstance(item, _WorkerUserError)), None)
        if failed is not None:
            return failed
        try:
            return self.collate(items)
        except UserError as exc:
            return _WorkerUserError(exc)


class _EpochBatches:
    """The batch sampler: from the loader's consumed position to the end of that epoch's last step.

    The DataLoader calls ``iter()`` on it each time the trainer starts a new iterator (a new
    epoch, a resume, an OOM shrink), so every iterator starts exactly where training stands.
    """

    def __init__(self, order: SampleOrder) -> None:
        self.order = order  # the trainer's live order: advanced as batches are consumed

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        # A private copy: the DataLoader prefetches ahead of what the trainer consumed.
        live = self.order
        sizes = (live.micro_batch_size, live.global_batch_size)
        order = SampleOrder(live.num_items, *sizes, live.rank, live.world_size, live.seed)
        order.step, order.offset = live.step, live.offset
        end = order.epoch_end_step()
        while order.step < end:
            positions = order.next_positions()
            yield list(zip(order.items(positions).tolist(), positions.tolist(), strict=True))


class MapStyleTrainLoader:
    """A ``TrainLoader`` over ``samples``, a dataset indexed by ``(item, position)`` keys
    (``SeededSamples`` wraps a plain one): shuffled, rank-sharded, resumable, with workers."""

    def __init__(
        self,
        samples: Dataset[Any],
        num_items: int,
        cfg: DataConfig,
        micro_batch_size: int,
        global_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        collate: Collate = collate_tuple,
    ) -> None:
        self.order = SampleOrder(num_items, micro_batch_size, global_batch_size, rank, world_size, seed)
        self.samples, self.cfg, self.collate = samples, cfg, collate
        self._loader: DataLoader[Any] | None = None
        self._batches: Iterator[Batch] | None = None

    def next_microbatch(self) -> Batch:
        """This rank's next micro-batch, as ``collate`` made it."""
        if self._batches is None:
            self._batches = iter(self._data_loader())
        try:
            batch = next(self._batches)
        except StopIteration:  # the epoch's iterator is done: the next one starts where we are
            self._batches = iter(self._data_loader())
            batch = next(self._batches)
        if isinstance(batch, _WorkerUserError):
            batch.reraise()
        self.order.next_positions()
        return batch

    def _data_loader(self) -> DataLoader[Any]:
        """One DataLoader for the run; with persistent workers its workers outlive each iterator."""
        if self._loader is None:
            workers = self.cfg.num_workers
            in_workers = workers > 0  # without workers a UserError is raised here as it is
            self._loader = DataLoader(
                _UserErrorsAsData(self.samples) if in_workers else self.samples,
                batch_sampler=_EpochBatches(self.order),
                collate_fn=_CollateUserErrors(self.collate) if in_workers else self.collate,
                # Each iterator draws its workers' base seed: from a generator of its own, never
                # from torch's global one, whose stream (dropout) a resumed run must replay exactly.
                generator=torch.Generator().manual_seed(self.order.seed),
                num_workers=workers,
                pin_memory=self.cfg.pin_memory and torch.cuda.is_available(),
                persistent_workers=self.cfg.persistent_workers,
                prefetch_factor=self.cfg.prefetch_factor if workers else None,
            )
        return self._loader

    def _restart(self) -> None:
        """Forget prefetched batches: the next micro-batch comes from the order's current state."""
        self._batches = None

    def state_dict(self) -> dict[str, int]:
        return self.order.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order.load_state_dict(state)
        self._restart()

    def set_micro_batch_size(self, micro_batch_size: int) -> None:
        self.order.set_micro_batch_size(micro_batch_size)
        self._restart()

    def close(self) -> None:
        """Stop worker processes now (they also stop when the loader is garbage-collected)."""
        self._batches = None
        self._loader = None


def rank_block(n: int, rank: int, world_size: int) -> np.ndarray:
    """Items (int64) of ``rank``'s contiguous block of a split of ``n``: ceil(n / W) each, the
    last ranks fewer (or none)."""
    per_rank = -(-n // world_size)
    return np.arange(rank * per_rank, min(n, (rank + 1) * per_rank), dtype=np.int64)


class MapStyleEvalBatches:
    """A validation split in micro-batches: this rank's contiguous block, unshuffled, the same
    number of batches on every rank (the missing ones are ``PaddingBatch``es of item 0)."""

    def __init__(
        self, dataset: Any, micro_batch_size: int, rank: int, world_size: int, collate: Collate
    ) -> None:
        n = len(dataset)
        self.items = rank_block(n, rank, world_size)
        per_rank = -(-n // world_size)
        self.n_batches = max(1, -(-per_rank // micro_batch_size))
        self.dataset, self.micro, self.collate = dataset, micro_batch_size, collate

    def __len__(self) -> int:
        return self.n_batches

    def __iter__(self) -> Iterator[Batch | PaddingBatch]:
        for i in range(self.n_batches):
            items: Sequence[int] = self.items[i * self.micro : (i + 1) * self.micro].tolist()
            if items:
                yield self.collate([self.dataset[item] for item in items])
            else:  # this rank ran out: a forward for the collectives, not counted
                yield PaddingBatch(self.collate([self.dataset[0]]))
