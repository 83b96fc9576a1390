"""Image batches for training and evaluation: a torch DataLoader driven by ``SampleOrder``.

Training batches are uint8 images (B, C, H, W) and int64 labels (B,); normalisation runs on the
device in the recipe (a quarter of the host-to-device bytes of float32 pixels).

Exact resume with worker processes: the sampler yields keys ``(item, position)`` where position
is the global sample position of ``SampleOrder``; the augmentation of a sample (crop offsets,
flip) is drawn from a hash of (seed, position), never from a worker's random state. So a batch
is the same whichever worker loads it and whatever ran before, and the loader state is just the
order's (step, offset): a resumed run rebuilds its DataLoader from there and replays nothing.

One DataLoader iterator spans one epoch (up to the step boundary after the epoch ends), so
``data.persistent_workers`` keeps workers alive across epochs, as users of torch expect.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from hpcpipe.config import DataConfig
from hpcpipe.data.images.formats import ImageSplit, decode_image_file
from hpcpipe.data.order import SampleOrder

PAD = 4  # pixels of zero padding around an image before the random crop
IGNORE_LABEL = -100  # cross_entropy's ignore_index: padding samples of the last evaluation batch
_MASK64 = (1 << 64) - 1


def mix64(seed: int, position: int) -> int:
    """SplitMix64 of (seed, position): 64 well-mixed random bits, a pure function of both."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class ImageSamples(Dataset[tuple[torch.Tensor, int]]):
    """``dataset[(item, position)]`` -> (uint8 (C, H, W), label), augmented from (seed, position)."""

    def __init__(self, split: ImageSplit, seed: int, augment: bool) -> None:
        self.split, self.seed, self.augment = split, seed, augment

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        item, position = key
        image = self.image(item)
        if self.augment:
            image = self._crop_and_flip(image, mix64(self.seed, position))
        return image, int(self.split.labels[item])

    def image(self, item: int) -> torch.Tensor:
        if self.split.images is not None:
            # A copy: the arrays may be read-only views of file bytes (IDX, CIFAR binary).
            return torch.from_numpy(np.array(self.split.images[item], copy=True))
        return decode_image_file(self.split.paths[item], self.split.shape[1:])

    @staticmethod
    def _crop_and_flip(image: torch.Tensor, bits: int) -> torch.Tensor:
        """Random crop of the zero-padded image (offsets in [0, 2*PAD]) and a coin-flip mirror."""
        from torchvision.transforms.v2 import functional as TF

        dy, dx, flip = bits % (2 * PAD + 1), (bits >> 8) % (2 * PAD + 1), (bits >> 16) & 1
        _, h, w = image.shape
        image = TF.crop(TF.pad(image, [PAD]), dy, dx, h, w)
        return TF.horizontal_flip(image) if flip else image


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
        order = SampleOrder(
            live.num_items,
            live.micro_batch_size,
            live.global_batch_size,
            live.rank,
            live.world_size,
            live.seed,
        )
        order.step, order.offset = live.step, live.offset
        end = order.epoch_end_step()
        while order.step < end:
            positions = order.next_positions()
            yield list(zip(order.items(positions).tolist(), positions.tolist(), strict=True))


class ImageTrainLoader:
    """The recipe's TrainLoader for images: shuffled, rank-sharded, resumable, with DataLoader workers."""

    def __init__(
        self,
        split: ImageSplit,
        cfg: DataConfig,
        micro_batch_size: int,
        global_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
    ) -> None:
        self.order = SampleOrder(len(split), micro_batch_size, global_batch_size, rank, world_size, seed)
        self.samples = ImageSamples(split, seed, cfg.augment)
        self.cfg = cfg
        self._loader: DataLoader[Any] | None = None
        self._batches: Iterator[list[torch.Tensor]] | None = None

    def next_microbatch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` uint8 (micro, C, H, W) and ``y`` int64 (micro,) of this rank's next micro-batch."""
        if self._batches is None:
            self._batches = iter(self._data_loader())
        try:
            images, labels = next(self._batches)
        except StopIteration:  # the epoch's iterator is done: the next one starts where we are
            self._batches = iter(self._data_loader())
            images, labels = next(self._batches)
        self.order.next_positions()
        return images, labels

    def _data_loader(self) -> DataLoader[Any]:
        """One DataLoader for the run; with persistent workers its workers outlive each iterator."""
        if self._loader is None:
            workers = self.cfg.num_workers
            self._loader = DataLoader(
                self.samples,
                batch_sampler=_EpochBatches(self.order),
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


class ImageEvalBatches:
    """The whole test split, sharded by rank in contiguous blocks, unshuffled, never augmented.

    Every rank runs the same number of batches (FSDP2 needs every rank in every forward): the
    ranks with fewer samples pad their last batch with label ``IGNORE_LABEL``, which the loss and
    the accuracy skip. Nothing is counted twice and nothing is left out.
    """

    def __init__(self, split: ImageSplit, micro_batch_size: int, rank: int, world_size: int) -> None:
        n = len(split)
        per_rank = -(-n // world_size)
        self.items = np.arange(rank * per_rank, min(n, (rank + 1) * per_rank), dtype=np.int64)
        self.n_batches = max(1, -(-per_rank // micro_batch_size))
        self.micro = micro_batch_size
        self.samples = ImageSamples(split, seed=0, augment=False)

    def __len__(self) -> int:
        return self.n_batches

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``x`` uint8 (<= micro, C, H, W) and ``y`` int64 labels, ``n_batches`` times."""
        shape = self.samples.split.shape
        for i in range(self.n_batches):
            items = self.items[i * self.micro : (i + 1) * self.micro].tolist()
            if not items:  # this rank ran out of samples: one ignored dummy keeps the counts equal
                yield torch.zeros((1, *shape), dtype=torch.uint8), torch.full((1,), IGNORE_LABEL)
                continue
            images = torch.stack([self.samples.image(item) for item in items])
            yield images, torch.as_tensor(self.samples.split.labels[items], dtype=torch.long)
