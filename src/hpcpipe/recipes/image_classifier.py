"""What the image-classification recipes share (``resnet-cifar``, ``torchvision-classifier``): the
image pipeline, normalisation on the device, the loss and top-1 accuracy.

Data come from ``data.format`` / ``data.root`` (``hpcpipe.data.images.formats``), verified against the
hash manifest written on first read. Batches arrive as uint8 and are normalised here, on the
device, with the training set's per-channel mean and std from that manifest. Evaluation covers
the whole test split (or ``data.max_eval_samples``) and reports ``val_loss`` and top-1 ``val_acc``.
BatchNorm's running statistics are buffers: DDP broadcasts rank 0's at every forward
(``broadcasts_buffers``), and every rank takes rank 0's before each evaluation and checkpoint
(``train/parallel.py``), so every rank evaluates and checkpoints the same model.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from hpcpipe.config import DataConfig, ModelConfig, TrainConfig
from hpcpipe.config.data import IMAGE_FORMATS
from hpcpipe.recipes.base import Batch, DataSummary, Goal, Recipe, TrainLoader

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class ImageClassifierRecipe(Recipe):
    """An image classifier on hpcpipe's image pipeline; a subclass builds the model."""

    metric_goals: ClassVar[dict[str, Goal]] = {"val_loss": "min", "val_acc": "max"}
    data_formats = IMAGE_FORMATS
    sample_noun = "images"

    model_cfg: ModelConfig
    data_cfg: DataConfig
    train_cfg: TrainConfig
    seed: int
    broadcasts_buffers: bool = True

    @abstractmethod
    def _classifier(self, start: bool = True) -> nn.Module:
        """The model for ``self.info``'s channels and classes, on the CPU: random, or from the
        recipe's starting weights when ``start`` (not for an export or a FLOP count)."""

    def _input_shape(self) -> tuple[int, ...]:
        """(C, H, W) of what the model sees (``normalize``'s output for one image)."""
        return tuple(self.info.shape)

    @classmethod
    def check_overrides(cls, work: Path) -> dict[str, Any]:
        """A small generated CIFAR-10 (``hpcpipe data make-images``) under ``work``."""
        from hpcpipe.data.images.generator import write_dataset

        root = work / "cifar10"
        write_dataset("cifar10", root, 64, 32, 0)
        return {"data.root": str(root), "data.prepared_dir": str(work / "prepared")}

    # -- data --------------------------------------------------------------------------------

    def prepare(self, progress: bool) -> DataSummary:
        from hpcpipe.data.images.manifest import info_summary, verify_or_record

        self.__dict__["info"] = verify_or_record(self.data_cfg)
        # The node's preparer verifies every staged hash; the other ranks then check sizes only.
        self.__dict__["image_dir"] = self._staged(verify="full")
        return info_summary(self.data_cfg.format, self.info)

    def stage_source(self, progress: bool = False) -> Any:
        from hpcpipe.data.images.manifest import verify_or_record
        from hpcpipe.data.stage import image_dataset_source

        info = verify_or_record(self.data_cfg)
        return image_dataset_source(info.root, info.manifest_path)

    @cached_property
    def image_dir(self) -> Path:
        return self._staged(verify="sizes")

    def _staged(self, verify: Literal["full", "sizes"]) -> Path:
        """The dataset's directory, or its node-local copy when ``data.cache_dir`` is set."""
        if self.data_cfg.cache_dir is None:
            return Path(self.info.root)
        from hpcpipe.data.stage import image_dataset_source, stage_for_reading

        source = image_dataset_source(self.info.root, self.info.manifest_path)
        return stage_for_reading(source, self.data_cfg.cache_dir, verify)

    @cached_property
    def info(self):  # type: ignore[no-untyped-def]  # ImageDatasetInfo
        # Ranks that did not prepare read the manifest local rank 0 has just verified.
        from hpcpipe.data.images.manifest import recorded_info

        return recorded_info(self.data_cfg)

    @cached_property
    def splits(self):  # type: ignore[no-untyped-def]  # dict[str, ImageSplit]
        from hpcpipe.data.images.formats import read_splits

        splits = read_splits(self.data_cfg.format, self.image_dir)
        return {
            "train": splits["train"].subset(self.data_cfg.max_train_samples),
            "test": splits["test"].subset(self.data_cfg.max_eval_samples),
        }

    def dataset_hash(self) -> str | None:
        return str(self.info.manifest_sha256)

    def samples_per_epoch(self) -> int | None:
        limit = self.data_cfg.max_train_samples
        return int(self.info.train_samples if limit is None else min(limit, self.info.train_samples))

    def train_loader(self, rank: int, world_size: int) -> TrainLoader:
        from hpcpipe.data.images.loader import ImageTrainLoader

        return ImageTrainLoader(
            self.splits["train"],
            self.data_cfg,
            micro_batch_size=self.train_cfg.micro_batch_size,
            global_batch_size=self.train_cfg.global_batch_size,
            rank=rank,
            world_size=world_size,
            seed=self.seed,
        )

    def eval_batches(self, rank: int, world_size: int) -> Iterable[Batch]:
        from hpcpipe.data.images.loader import ImageEvalBatches

        return ImageEvalBatches(self.splits["test"], self.train_cfg.micro_batch_size, rank, world_size)

    # -- model, loss and evaluation ------------------------------------------------------------

    def build_model(self) -> nn.Module:
        import torch

        model = self._classifier()
        if self.train_cfg.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model

    def flops_per_sample(self) -> float | None:
        """Training FLOPs per image: 3x the forward pass, counted by torch on the meta device."""
        import torch

        with torch.device("meta"):
            model = self._classifier(start=False)
        return training_flops(model, self._input_shape())

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, C, H, W) -> float (B, C, H, W), standardised per channel."""
        import torch

        mean = torch.tensor(self.info.mean, device=images.device).view(1, -1, 1, 1)
        std = torch.tensor(self.info.std, device=images.device).view(1, -1, 1, 1)
        x = (images.float() / 255.0 - mean) / std
        return x.contiguous(memory_format=torch.channels_last) if self.train_cfg.channels_last else x

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        import torch.nn.functional as F

        images, labels = batch  # (B, C, H, W) uint8, (B,) int64
        logits = model(self.normalize(images))  # (B, classes)
        return F.cross_entropy(logits.float(), labels, label_smoothing=self.train_cfg.label_smoothing)

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        import torch.nn.functional as F

        from hpcpipe.data.images.loader import IGNORE_LABEL

        images, labels = batch
        logits = model(self.normalize(images)).float()  # (B, classes)
        valid = labels != IGNORE_LABEL
        return {
            "loss": F.cross_entropy(logits, labels, ignore_index=IGNORE_LABEL, reduction="sum"),
            "correct": ((logits.argmax(dim=1) == labels) & valid).sum(),
            "count": valid.sum(),
        }

    def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        count = max(totals["count"], 1.0)
        return {"val_loss": totals["loss"] / count, "val_acc": totals["correct"] / count}


def training_flops(model: nn.Module, shape: tuple[int, ...]) -> float:
    """3x the forward FLOPs per image of ``model`` (on the meta device) on images of ``shape``."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    # Under the meta device, so that tensors a forward creates meet the model there.
    with torch.device("meta"), FlopCounterMode(display=False) as counter:
        model(torch.empty((2, *shape)))  # BatchNorm trains on > 1 value per channel
    return 3.0 * counter.get_total_flops() / 2
