"""Workload recipes, registered by name (``run.recipe``)."""

from __future__ import annotations

from collections.abc import Callable

from hpcpipe.config import JobConfig
from hpcpipe.errors import ConfigError
from hpcpipe.recipes.base import Recipe

_REGISTRY: dict[str, Callable[[JobConfig], Recipe]] = {}


def _gpt(job: JobConfig) -> Recipe:
    from hpcpipe.recipes.gpt import GPTRecipe

    return GPTRecipe.from_job(job)


def _resnet(job: JobConfig) -> Recipe:
    from hpcpipe.recipes.resnet import ResNetRecipe

    return ResNetRecipe.from_job(job)


def _lora_fc(job: JobConfig) -> Recipe:
    from hpcpipe.recipes.lora_fc import LoraFCRecipe

    return LoraFCRecipe.from_job(job)


_REGISTRY["gpt"] = _gpt
_REGISTRY["resnet-cifar"] = _resnet
_REGISTRY["lora-function-calling"] = _lora_fc


def build_recipe(job: JobConfig) -> Recipe:
    try:
        factory = _REGISTRY[job.run.recipe]
    except KeyError:
        raise ConfigError(f"run.recipe: unknown recipe {job.run.recipe!r} ({', '.join(_REGISTRY)})") from None
    return factory(job)


def recipe_names() -> list[str]:
    return sorted(_REGISTRY)
