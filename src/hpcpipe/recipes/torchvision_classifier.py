"""The `torchvision-classifier` recipe: any ``torchvision.models`` classification model (resnet50,
vit_b_16, convnext_tiny, efficientnet_b0, ...) on every image format hpcpipe reads (CIFAR, IDX,
ImageFolder), with the image pipeline, normalisation, loss and top-1 accuracy of ``resnet-cifar``
(``image_classifier.py``).

- The model is ``torchvision.models.get_model(recipe.arch, num_classes=<the data's classes>,
  **recipe.model_kwargs)``, randomly initialised; ``recipe.weights`` starts it from a local file of
  weights instead (torchvision's own ``.pth`` files, or safetensors; nothing is downloaded).
- Images are normalised on the device; grey-scale images are repeated to the 3 channels every
  torchvision model takes, and ``recipe.image_size`` resizes them there (a ViT needs its size:
  224, or ``model_kwargs: {image_size: 32}``); ``prepare`` checks, with one forward on the meta
  device, that the model takes them. Models with auxiliary heads (googlenet, inception_v3) are
  built without them (``_default_kwargs``).
- FSDP2 shards a ResNet's four stages, or else the blocks of the model's largest sequence of
  blocks (a ViT's encoder layers, a ConvNeXt's or EfficientNet's feature stages).
- Export ``safetensors``: the model's state dict and ``classifier.json`` (arch, classes, kwargs):
  ``torchvision.models.get_model(arch, num_classes=N, **kwargs).load_state_dict(...)`` loads it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from hpcpipe.config import JobConfig
from hpcpipe.errors import ConfigError
from hpcpipe.recipes.args import parse_args
from hpcpipe.recipes.base import ExportRequest
from hpcpipe.recipes.image_classifier import ImageClassifierRecipe, training_flops

if TYPE_CHECKING:
    import torch
    from torch import nn

EXPORT_FILE = "model.safetensors"
EXPORT_INFO = "classifier.json"


class TorchvisionArgs(BaseModel):
    """The ``recipe:`` section of ``torchvision-classifier``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arch: str = Field("resnet18", min_length=1, description="A torchvision.models classification model name.")
    image_size: int | None = Field(
        None, ge=8, description="Resize images (on the device) to this side; null: as stored."
    )
    weights: str | None = Field(
        None,
        description="A local file of weights to start from (torchvision's .pth, or safetensors); "
        "tensors whose shape differs (the head, for another number of classes) keep their init.",
    )
    model_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="More keyword arguments of get_model (e.g. {dropout: 0.2})."
    )


@dataclass
class TorchvisionClassifier(ImageClassifierRecipe):
    name = "torchvision-classifier"
    summary = "Any torchvision.models classifier (resnet50, vit_b_16, convnext_tiny, ...) on your images"
    Args = TorchvisionArgs
    export_formats = ("safetensors",)
    worker_imports = ("hpcpipe.data.images.loader", "torchvision")
    check_preset = "torchvision-tiny"

    args: TorchvisionArgs = field(default_factory=TorchvisionArgs)

    @classmethod
    def from_job(cls, job: JobConfig) -> TorchvisionClassifier:
        args = parse_args(cls.Args, job.recipe)
        return cls(model_cfg=job.model, data_cfg=job.data, train_cfg=job.train, seed=job.run.seed, args=args)

    @classmethod
    def check_overrides(cls, work: Path) -> dict[str, Any]:
        """The preset's data generated under ``work``; ResNet-18, whose training draws no random
        numbers (MobileNetV3's dropout would differ between 1 and 2 ranks by design)."""
        return {**super().check_overrides(work), "recipe.arch": "resnet18"}

    @classmethod
    def describe_model(cls, job: JobConfig) -> str:
        root = job.data.root or "default root"
        return f"torchvision {job.recipe.get('arch')} on {job.data.format} images ({root})"

    def prepare(self, progress: bool) -> Any:
        self._check_arch()  # a misspelt model name: one line before any worker starts
        summary = super().prepare(progress)
        self._check_forward()  # images the model cannot take: one line, not every worker's traceback
        return summary

    def _check_arch(self) -> None:
        from torchvision import models

        known = models.list_models(module=models)
        if self.args.arch not in known:
            raise ConfigError(
                f"recipe.arch: {self.args.arch!r} is not a torchvision classifier (known: {', '.join(known)})"
            )

    def _classifier(self, start: bool = True) -> nn.Module:
        from torchvision import models

        self._check_arch()
        try:
            model = models.get_model(
                self.args.arch, weights=None, num_classes=len(self.info.classes), **self._model_kwargs()
            )
        except (TypeError, ValueError, AssertionError) as exc:  # a keyword or value the model does not take
            raise ConfigError(f"recipe.model_kwargs: {exc}") from None
        if start and self.args.weights:
            _load_start(model, Path(self.args.weights))
        return model

    def _model_kwargs(self) -> dict[str, Any]:
        """``recipe.model_kwargs`` over the recipe's defaults (``_default_kwargs``)."""
        return {**_default_kwargs(self.args.arch), **self.args.model_kwargs}

    def _meta_classifier(self) -> nn.Module | None:
        """The model on the meta device; None where its builder computes with tensors' values
        (regnet's block widths), which the meta device does not hold."""
        import torch

        try:
            with torch.device("meta"):
                return self._classifier(start=False)
        except NotImplementedError:
            return None

    def _check_forward(self) -> None:
        """A training forward of two images on the meta device: images smaller than the model's
        layers take, or other than the size it was built for (a ViT), or an output that is not one
        tensor of logits, is one line naming the key to change."""
        import torch

        model = self._meta_classifier()
        if model is None:
            return  # nothing to check it with short of a real build; flops_per_sample says None too
        shape = self._input_shape()
        try:
            with torch.device("meta"):
                out = model(torch.empty((2, *shape)))
        except NotImplementedError:
            return  # an operation without a meta kernel: the size is not what failed
        except (RuntimeError, AssertionError, ValueError) as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(
                f"recipe.image_size: {self.args.arch} does not take {'x'.join(map(str, shape))} images "
                f"({reason}); {_size_hint(model, shape[-1])}"
            ) from None
        if not isinstance(out, torch.Tensor):
            raise ConfigError(
                f"recipe.model_kwargs: {self.args.arch} returns {type(out).__name__} in training, not one "
                "tensor of logits (auxiliary heads are not trained here: leave aux_logits out)"
            )

    def flops_per_sample(self) -> float | None:
        model = self._meta_classifier()
        return None if model is None else training_flops(model, self._input_shape())

    def _input_shape(self) -> tuple[int, ...]:
        _, h, w = self.info.shape
        side = self.args.image_size
        return (3, side, side) if side else (3, h, w)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, C, H, W) -> float (B, 3, S, S): standardised, grey repeated, resized."""
        import torch.nn.functional as F

        x = super().normalize(images)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if self.args.image_size:
            size = (self.args.image_size, self.args.image_size)
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=False)
        return x

    def shard_units(self, model: nn.Module) -> Sequence[nn.Module]:
        from hpcpipe.models.vision_units import shard_units

        return shard_units(model)

    def export(self, request: ExportRequest) -> Path:
        """The checkpoint's weights as safetensors (in ``request.dtype``), with what rebuilds the model."""
        from safetensors.torch import save_model

        from hpcpipe.checkpoint.export import load_weights

        model = self._classifier(start=False)  # every weight comes from the checkpoint
        load_weights(request.checkpoint, model)
        request.out.mkdir(parents=True, exist_ok=True)
        save_model(model.to(request.torch_dtype()), str(request.out / EXPORT_FILE))
        info = {
            "arch": self.args.arch,
            "num_classes": len(self.info.classes),
            "kwargs": self._model_kwargs(),  # with the recipe's defaults, so get_model builds the same
            "classes": list(self.info.classes),
            "image_size": self.args.image_size,
        }
        (request.out / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")
        return request.out

    def load_export(self, fmt: str, path: Path) -> Any:
        """As a user would: torchvision's model of that name, loaded strictly."""
        from safetensors.torch import load_model
        from torchvision import models

        info = json.loads((path / EXPORT_INFO).read_text())
        model = models.get_model(
            info["arch"], weights=None, num_classes=info["num_classes"], **info["kwargs"]
        )
        load_model(model, str(path / EXPORT_FILE), strict=True)
        return model


def _size_hint(model: nn.Module, side: int) -> str:
    """What to set for a model that refused images of ``side``: a model built for one size (a
    ViT) names it and the keyword that builds it for ``side``."""
    built_for = getattr(model, "image_size", None)
    if isinstance(built_for, int):
        return f"set recipe.image_size: {built_for}, or recipe.model_kwargs: {{image_size: {side}}}"
    return "set recipe.image_size to a side it takes (224, the size torchvision's classifiers are made for)"


def _default_kwargs(arch: str) -> dict[str, Any]:
    """``aux_logits=False`` where the model's class takes it (googlenet, inception_v3): with their
    auxiliary heads they return a namedtuple of logits in training, whose extra heads the one
    cross-entropy would leave unused (DDP stops on unused parameters at its second step), and
    inception_v3's needs images of about 299 pixels. Without them they train as every other
    model does."""
    import inspect

    from torchvision import models

    built = inspect.signature(models.get_model_builder(arch)).return_annotation
    takes = isinstance(built, type) and "aux_logits" in inspect.signature(built).parameters
    return {"aux_logits": False} if takes else {}


def _load_start(model: nn.Module, path: Path) -> None:
    """``path``'s tensors into ``model`` where names and shapes match (never unpickling code)."""
    import torch

    if not path.is_file():
        raise ConfigError(f"recipe.weights: {path} does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ConfigError(f"recipe.weights: {path} is not a file of weights ({exc})") from None
    own = model.state_dict()
    fitting = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    if not fitting:
        raise ConfigError(f"recipe.weights: no tensor of {path} fits recipe.arch's model")
    model.load_state_dict(fitting, strict=False)
