"""Workload recipes: ``catalog`` declares each one (what fits it, how it exports and is evaluated);
this module builds one by name (``run.recipe``), importing its code only then.

Importing this package stays light (no torch, no config at import time): the config validates jobs
against ``hpcpipe.recipes.catalog``, which lives in this package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hpcpipe.errors import ConfigError
from hpcpipe.recipes.catalog import RECIPES

if TYPE_CHECKING:
    from hpcpipe.config import JobConfig
    from hpcpipe.recipes.base import Recipe


def _gpt(job: JobConfig) -> Recipe:
    from hpcpipe.recipes.gpt import GPTRecipe

    return GPTRecipe.from_job(job)


def _resnet(job: JobConfig) -> Recipe:
    from hpcpipe.recipes.resnet import ResNetRecipe

    return ResNetRecipe.from_job(job)


def _lora_fc(job: JobConfig) -> Recipe:
    from hpcpipe.recipes.lora_fc import LoraFCRecipe

    return LoraFCRecipe.from_job(job)


# One factory per catalog entry (a unit test checks that they match).
FACTORIES: dict[str, Callable[[JobConfig], Recipe]] = {
    "gpt": _gpt,
    "resnet-cifar": _resnet,
    "lora-function-calling": _lora_fc,
}


# What a recipe's workers import beyond the trainer: its module, its data pipeline, its model. The
# agent's fork server imports them once (``launch/job.py worker_preload``), so a started or
# restarted worker does not (with the trainer's own helpers, ``launch/job.py WORKER_PRELOAD``:
# a killed rank of the tiny GPT recovers in 0.33 s median instead of 0.47 s, 10 trials each).
WORKER_MODULES: dict[str, tuple[str, ...]] = {
    "gpt": ("hpcpipe.recipes.gpt", "hpcpipe.data.tokens.loader", "hpcpipe.models.gpt"),
    "resnet-cifar": ("hpcpipe.recipes.resnet", "hpcpipe.data.images.loader", "hpcpipe.models.resnet"),
    "lora-function-calling": ("hpcpipe.recipes.lora_fc", "hpcpipe.data.function_calling.loader"),
}


def build_recipe(job: JobConfig) -> Recipe:
    try:
        factory = FACTORIES[job.run.recipe]
    except KeyError:
        raise ConfigError(f"run.recipe: unknown recipe {job.run.recipe!r} ({', '.join(FACTORIES)})") from None
    return factory(job)


def recipe_names() -> list[str]:
    return sorted(RECIPES)
