"""The `resnet-cifar` recipe: torchvision ResNet-18 with a stem for small images (CIFAR, IDX,
ImageFolder) on hpcpipe's image pipeline (``image_classifier.py``). ``torchvision-classifier``
trains any other torchvision model on the same pipeline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcpipe.config import JobConfig
from hpcpipe.recipes.image_classifier import ImageClassifierRecipe

if TYPE_CHECKING:
    from torch import nn


@dataclass
class ResNetRecipe(ImageClassifierRecipe):
    name = "resnet-cifar"
    summary = "torchvision ResNet-18 image classification (CIFAR, MNIST-style IDX, ImageFolder)"
    model_variants = ("resnet18", "resnet18-imagenet")
    worker_imports = ("hpcpipe.data.images.loader", "hpcpipe.models.resnet", "torchvision")
    check_preset = "resnet-tiny"

    @classmethod
    def from_job(cls, job: JobConfig) -> ResNetRecipe:
        return cls(model_cfg=job.model, data_cfg=job.data, train_cfg=job.train, seed=job.run.seed)

    @classmethod
    def describe_model(cls, job: JobConfig) -> str:
        root = job.data.root or "default root"
        return f"torchvision {job.model.variant} on {job.data.format} images ({root})"

    def _classifier(self, start: bool = True) -> nn.Module:
        from hpcpipe.models.resnet import build_resnet18

        return build_resnet18(self.model_cfg.variant, int(self.info.shape[0]), len(self.info.classes))

    def shard_units(self, model: nn.Module) -> Sequence[nn.Module]:
        from hpcpipe.models.resnet import stages

        return stages(model)
