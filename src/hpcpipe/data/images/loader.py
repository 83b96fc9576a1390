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

import numpy as np
import torch
from torch.utils.data import Dataset

from hpcpipe.config import DataConfig
from hpcpipe.data.images.formats import ImageSplit, decode_image_file
from hpcpipe.data.map_style import MapStyleTrainLoader, mix64, rank_block

PAD = 4  # pixels of zero padding around an image before the random crop
IGNORE_LABEL = -100  # cross_entropy's ignore_index: padding samples of the last evaluation batch


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


class ImageTrainLoader(MapStyleTrainLoader):
    """The recipe's TrainLoader for images: shuffled, rank-sharded, resumable, with DataLoader
    workers (``data/map_style.py``); micro-batches of ``x`` uint8 (micro, C, H, W) and ``y`` int64."""

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
        samples = ImageSamples(split, seed, cfg.augment)
        sizes = (micro_batch_size, global_batch_size)
        super().__init__(samples, len(split), cfg, *sizes, rank, world_size, seed)


class ImageEvalBatches:
    """The whole test split, sharded by rank in contiguous blocks, unshuffled, never augmented.

    Every rank runs the same number of batches (FSDP2 needs every rank in every forward): the
    ranks with fewer samples pad their last batch with label ``IGNORE_LABEL``, which the loss and
    the accuracy skip. Nothing is counted twice and nothing is left out.
    """

    def __init__(self, split: ImageSplit, micro_batch_size: int, rank: int, world_size: int) -> None:
        per_rank = -(-len(split) // world_size)
        self.items = rank_block(len(split), rank, world_size)
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
