"""What each recipe is and accepts, declared without importing it: the questions the rest of the
house asks about a recipe (which model variants and data formats fit it, which metrics its
evaluation rows carry, how it exports, how it is evaluated, whether the roofline models it).

This module sits in the bottom room (ARCHITECTURE.md): the config validates a job against it and
the tools above ask it, so none of them spells a recipe's name. It imports nothing of hpcpipe but
the config's list of data formats. The recipe's code is built by ``hpcpipe.recipes.build_recipe``.

Adding a recipe: its module in ``recipes/``, its ``RecipeName`` and ``RECIPES`` entry here, its
factory in ``recipes/__init__.py``, and a preset (ARCHITECTURE.md has the checklist).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hpcpipe.config.data import FUNCTION_CALLING_FORMATS, IMAGE_FORMATS, TOKEN_FORMATS

RecipeName = Literal["gpt", "resnet-cifar", "lora-function-calling"]
Evaluation = Literal["function-calling"]


@dataclass(frozen=True)
class RecipeSpec:
    """One recipe, declared."""

    name: str
    summary: str  # one line for --help and error messages
    model_variants: tuple[str, ...]  # model.variant values it builds
    data_formats: tuple[str, ...]  # data.format values it reads
    eval_metrics: tuple[str, ...]  # keys of its evaluation rows in metrics.jsonl (hpo.metric)
    export_formats: tuple[str, ...] = ()  # `ckpt export --format` values; the first is the pipeline's
    evaluations: tuple[Evaluation, ...] = ()  # `hpcpipe eval <kind>` it supports
    needs_model_source: bool = False  # model.name_or_path is required (a pre-trained base)
    # The model is hpcpipe's own transformer, shaped by model.n_layers, d_model and seq_len: `hpcpipe
    # roofline` knows its operations and `presets list` shows that shape.
    own_transformer: bool = False
    # Heavy libraries its workers import: the agent's fork server imports them once for all ranks.
    worker_imports: tuple[str, ...] = ()

    @property
    def default_export(self) -> str | None:
        """The format `hpcpipe run`'s export step writes with pipeline.export_format=auto."""
        return self.export_formats[0] if self.export_formats else None


RECIPES: dict[str, RecipeSpec] = {
    spec.name: spec
    for spec in (
        RecipeSpec(
            name="gpt",
            summary="LM pretraining of hpcpipe's own GPT/Llama-style model on token shards",
            model_variants=("gpt2", "llama"),
            data_formats=TOKEN_FORMATS,
            eval_metrics=("val_loss", "val_ppl"),
            export_formats=("hf", "safetensors"),
            own_transformer=True,
        ),
        RecipeSpec(
            name="resnet-cifar",
            summary="torchvision ResNet-18 image classification (CIFAR, MNIST-style IDX, ImageFolder)",
            model_variants=("resnet18", "resnet18-imagenet"),
            data_formats=IMAGE_FORMATS,
            eval_metrics=("val_loss", "val_acc"),
            worker_imports=("torchvision",),
        ),
        RecipeSpec(
            name="lora-function-calling",
            summary="LoRA fine-tuning of a Hugging Face causal LM on function-calling conversations",
            model_variants=("hf-causal-lm",),
            data_formats=FUNCTION_CALLING_FORMATS,
            eval_metrics=("val_loss", "val_token_acc"),
            export_formats=("adapter", "merged"),
            evaluations=("function-calling",),
            needs_model_source=True,
            worker_imports=("transformers", "peft"),
        ),
    )
}


def recipe_spec(name: str) -> RecipeSpec:
    """The declaration of recipe ``name``; ValueError naming the known ones."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r} (known: {', '.join(RECIPES)})") from None


def recipes_with(evaluation: Evaluation) -> list[str]:
    """Names of the recipes that support ``hpcpipe eval <evaluation>``."""
    return [name for name, spec in RECIPES.items() if evaluation in spec.evaluations]
