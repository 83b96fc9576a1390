"""torchvision-classifier on every model torchvision lists: models with auxiliary heads train on
their logits, and images a model cannot take are one line naming recipe.image_size when the job
prepares, not a worker's traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hpcpipe.config import apply_values, load_config
from hpcpipe.data.images.generator import write_dataset
from hpcpipe.errors import ConfigError
from hpcpipe.recipes import build_recipe
from hpcpipe.recipes.torchvision_classifier import TorchvisionClassifier


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated CIFAR-10 of 32-pixel images (its prepared files beside it)."""
    return write_dataset("cifar10", tmp_path_factory.mktemp("tv") / "cifar10", 8, 4)


def _prepared(data: Path, arch: str, **recipe: Any) -> TorchvisionClassifier:
    values = {"data.root": str(data), "data.prepared_dir": str(data.parent / "prepared"), "recipe.arch": arch}
    values.update({f"recipe.{key}": value for key, value in recipe.items()})
    job = apply_values(load_config("torchvision-tiny"), values)
    recipe_ = build_recipe(job)
    assert isinstance(recipe_, TorchvisionClassifier)
    recipe_.prepare(progress=False)
    return recipe_


def test_googlenet_trains_on_its_logits_with_every_parameter_used(data: Path) -> None:
    recipe = _prepared(data, "googlenet")
    model = recipe.build_model().train()
    images, labels = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8), torch.tensor([0, 1])
    recipe.loss(model, (images, labels)).backward()
    assert all(p.grad is not None for p in model.parameters())  # none DDP would wait for
    assert recipe._model_kwargs() == {"aux_logits": False}  # what the export records, to rebuild it


def test_auxiliary_heads_asked_for_are_refused_when_the_job_prepares(data: Path) -> None:
    refused = r"recipe\.model_kwargs: googlenet returns GoogLeNetOutputs in training"
    with pytest.raises(ConfigError, match=refused):
        _prepared(data, "googlenet", model_kwargs={"aux_logits": True})


@pytest.mark.parametrize(
    ("arch", "hint"),
    [
        ("vit_b_16", "(Wrong image height! Expected 224 but got 32!); set recipe.image_size: 224, or "),
        ("alexnet", "set recipe.image_size to a side it takes (224"),
    ],
)
def test_images_the_model_cannot_take_name_recipe_image_size(data: Path, arch: str, hint: str) -> None:
    with pytest.raises(ConfigError) as err:
        _prepared(data, arch)
    message = str(err.value)
    assert message.startswith(f"recipe.image_size: {arch} does not take 3x32x32 images (") and hint in message
    assert "\n" not in message and (arch != "vit_b_16" or message.endswith("{image_size: 32}"))


def test_a_vit_built_for_the_images_or_given_its_size_prepares(data: Path) -> None:
    assert _prepared(data, "vit_b_16", model_kwargs={"image_size": 32}).flops_per_sample()
    _prepared(data, "vit_b_32", image_size=224)


def test_a_model_the_meta_device_cannot_build_prepares_and_counts_no_flops(data: Path) -> None:
    """regnet's builder computes its block widths with tensors' values, which meta tensors lack."""
    assert _prepared(data, "regnet_x_400mf").flops_per_sample() is None
