"""Tensor parallelism applied outside model code: the recipe's plan on the mesh's ``tp`` dimension.

A plan maps module names to DTensor parallel styles (``ColwiseParallel``, ``RowwiseParallel``,
``SequenceParallel``, ``PrepareModuleInput``), as torchtitan's are written;
``Recipe.tensor_parallel_plan`` returns it for the job's model and degree. ``parallelize_module``
replaces each named module's parameters by DTensors sharded over the tp group, and its hooks
redistribute inputs and outputs (all-gather, reduce-scatter, all-reduce) around it.

Tied parameters (the GPT's token embedding and LM head are one tensor) come apart when each module
is distributed on its own; they are tied again here, which is only correct when both got the same
placement (a row-wise embedding and a column-wise head both shard the (V, C) matrix by rows).

A plan may also mark a dropout that runs on sequence-parallel shards with
``hpcpipe.models.shard_dropout.ShardDropout``: DTensor has no style for it, so it is swapped in
here (each rank draws the whole tensor's mask and keeps its chunk).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from fnmatch import fnmatch
from typing import Any

from torch import nn

from hpcpipe.errors import ConfigError
from hpcpipe.models.shard_dropout import ShardDropout, swap_in_shard_dropout
from hpcpipe.recipes.base import no_plan_message


def tensor_parallel_plan(recipe: Any, model: nn.Module, tp: int) -> Mapping[str, Any]:
    """The recipe's plan for ``model`` at degree ``tp``; ConfigError when it has none."""
    plan = recipe.tensor_parallel_plan(model, tp)
    if plan is None:
        raise ConfigError(no_plan_message(recipe.name, tp))
    return plan


def apply_tensor_parallel(model: nn.Module, plan: Mapping[str, Any], tp_mesh: Any) -> None:
    """Shard ``model`` in place by ``plan`` over ``tp_mesh``, then re-tie shared parameters."""
    from torch.distributed.tensor.parallel import parallelize_module

    missing = [name for name in plan if "*" not in name and not _has_module(model, name)]
    if missing:
        raise ConfigError(
            f"parallel.tp: the recipe's tensor-parallel plan names modules the model lacks: {missing[:3]}"
        )
    # FSDP2 warns that the root returns a view: the all-gathered logits are consumed out of place
    # by the loss, which is the case the warning is not about.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    tied = _tied_aliases(model)
    dropouts = {name: entry for name, entry in plan.items() if isinstance(entry, ShardDropout)}
    parallelize_module(model, tp_mesh, {k: v for k, v in plan.items() if k not in dropouts})
    for pattern, entry in dropouts.items():
        for name in _matching(model, pattern):
            swap_in_shard_dropout(model, name, entry, tp_mesh.get_local_rank(), tp_mesh.size())
    for owner, aliases in tied:
        shared = _get(model, owner)
        for alias in aliases:
            _check_same_placement(owner, alias, shared, _get(model, alias))
            module_name, _, attr = alias.rpartition(".")
            setattr(model.get_submodule(module_name), attr, shared)


def _tied_aliases(model: nn.Module) -> list[tuple[str, list[str]]]:
    """(first name, other names) of every parameter that appears under several names."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [(group[0], group[1:]) for group in names.values() if len(group) > 1]


def _check_same_placement(owner: str, alias: str, shared: Any, other: Any) -> None:
    if getattr(shared, "placements", None) != getattr(other, "placements", None):
        raise ConfigError(
            f"parallel.tp: {owner} and {alias} are one tied tensor but the tensor-parallel plan shards "
            "them differently; give both the same placement"
        )


def _get(model: nn.Module, name: str) -> Any:
    module_name, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(module_name), attr)


def _matching(model: nn.Module, pattern: str) -> list[str]:
    """Module names matching ``pattern`` token by token, as ``parallelize_module`` reads a plan's
    keys (``*`` stands for one name between dots)."""
    tokens = pattern.split(".")
    return [
        name
        for name, _ in model.named_modules()
        if len(parts := name.split(".")) == len(tokens) and all(map(fnmatch, parts, tokens))
    ]


def _has_module(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True
