"""A recipe's model laid out on the ranks: tensor parallelism, activation checkpointing,
compilation and data parallelism applied outside the model code; under a pipeline, to this
rank's stages."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hpcpipe.config import ParallelConfig, TrainConfig
from hpcpipe.recipes.base import Recipe
from hpcpipe.train.activation_checkpointing import apply_activation_checkpointing
from hpcpipe.train.distributed import DistContext
from hpcpipe.train.mesh import Layout
from hpcpipe.train.parallel import apply_parallelism
from hpcpipe.train.pipeline_parallel import Pipeline, build_pipeline
from hpcpipe.train.tensor_parallel import apply_tensor_parallel, tensor_parallel_plan


def parallelize(
    recipe: Recipe,
    model: torch.nn.Module,
    units: Sequence[torch.nn.Module],
    p: ParallelConfig,
    train: TrainConfig,
    placed: tuple[Layout, str, DistContext],
    accum: int,
) -> tuple[torch.nn.Module, Pipeline | None]:
    """The model to train (this rank's stages' modules under a pipeline) and the pipeline, if
    any. ``placed``: the ranks' layout, the data-parallel strategy and the data-parallel context."""
    layout, strategy, ctx = placed

    def wrap(module: torch.nn.Module, blocks: Sequence[torch.nn.Module]) -> torch.nn.Module:
        # DDP or FSDP2 over the data-parallel ranks (the dp dimension of a mesh).
        flags = (recipe.broadcasts_buffers, recipe.fsdp_param_dtype)
        return apply_parallelism(module, strategy, ctx, blocks, p, *flags, dp_mesh=layout.dp_mesh)

    if layout.pp > 1:  # the recipe's stages on this rank, sharded and scheduled
        pipeline = build_pipeline(recipe, model, units, p, layout, train, wrap, accum, ctx.device)
        return pipeline.modules, pipeline
    if layout.tp > 1:  # the recipe's plan, on the mesh's tp dimension
        apply_tensor_parallel(model, tensor_parallel_plan(recipe, model, p.tp), layout.tp_mesh)
    apply_activation_checkpointing(units, train.activation_checkpointing)
    if train.compile:
        # Compile blocks before FSDP2 wraps them (per-block graphs), the whole model otherwise.
        for module in units if strategy == "fsdp" else [model]:
            module.compile()
    return wrap(model, units), None
