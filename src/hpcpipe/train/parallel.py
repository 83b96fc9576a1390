"""Parallelism applied outside the model: DDP or FSDP2 wrapping (DeepSpeed's engine: ``deepspeed.py``),
gradient-sync control, clipping and the optimizer step for each."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from hpcpipe import compat
from hpcpipe.config import ParallelConfig
from hpcpipe.errors import ConfigError
from hpcpipe.train.deepspeed import is_engine
from hpcpipe.train.distributed import DistContext
from hpcpipe.train.precision import Precision


def resolve_strategy(strategy: str, world_size: int, tp: int = 1) -> str:
    """``auto`` means DDP for several ranks (FSDP2 beside tensor parallelism, ``tp`` > 1); a single
    process never wraps (DeepSpeed is refused there: its engine, offload and checkpoint format
    would silently not be what the job asked). ``world_size`` counts data-parallel ranks."""
    if world_size == 1 and strategy == "deepspeed":
        raise ConfigError(
            "parallel.strategy=deepspeed needs 2 or more ranks (--nproc 2, or several nodes); "
            "one process trains with parallel.strategy=single"
        )
    if world_size == 1:
        return "single"
    if strategy == "auto":
        return "fsdp" if tp > 1 else "ddp"
    if strategy == "single":
        raise ConfigError(f"parallel.strategy=single cannot run on {world_size} ranks; use ddp, fsdp or auto")
    return strategy


def apply_parallelism(
    model: nn.Module,
    strategy: str,
    ctx: DistContext,
    shard_units: Sequence[nn.Module],
    cfg: ParallelConfig,
    recipe_broadcasts_buffers: bool,
    fsdp_param_dtype: torch.dtype | None = None,
    dp_mesh: Any = None,
) -> nn.Module:
    """Wrap ``model`` for ``strategy``. ``shard_units`` are the blocks FSDP2 shards one by one.

    ``recipe_broadcasts_buffers`` is the recipe's choice for DDP's per-forward buffer broadcast
    when ``parallel.broadcast_buffers`` is null: BatchNorm's running statistics drift apart per
    rank without it; the GPT's buffers (RoPE tables) are identical on every rank by construction
    and would only be re-sent every step. ``fsdp_param_dtype`` (the recipe's) makes FSDP2 gather
    every parameter of a unit in that dtype and reduce gradients in fp32: a unit mixing a bf16
    frozen base with fp32 LoRA adapters cannot be gathered in one buffer otherwise. ``dp_mesh``:
    the data-parallel dimension of a tensor-parallel mesh (train/mesh.py), FSDP2's mesh then
    (its DTensor parameters become 2-D: sharded over dp and tp); None: the world.
    """
    if strategy in ("single", "deepspeed"):
        return model  # deepspeed: the engine wraps model and optimizer together (deepspeed.py)
    if strategy == "ddp":
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        broadcast = buffers_broadcast(cfg, recipe_broadcasts_buffers)
        return DistributedDataParallel(
            model,
            device_ids=device_ids,
            bucket_cap_mb=cfg.bucket_cap_mb,
            gradient_as_bucket_view=cfg.gradient_as_bucket_view,
            static_graph=cfg.static_graph,
            find_unused_parameters=cfg.find_unused_parameters,
            **compat.ddp_buffer_sync_kwargs(broadcast),
        )
    if strategy == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy()
        if fsdp_param_dtype is not None:
            policy = MixedPrecisionPolicy(param_dtype=fsdp_param_dtype, reduce_dtype=torch.float32)
        # Each block is its own all-gather/reduce-scatter unit, so communication for block i+1
        # overlaps compute of block i; the root wrap covers embeddings, final norm and head.
        for unit in shard_units:
            fully_shard(unit, mesh=dp_mesh, mp_policy=policy)
        fully_shard(model, mesh=dp_mesh, mp_policy=policy)
        return model
    raise ConfigError(f"parallel.strategy: unknown strategy {strategy!r}")


def time_gradient_sync(model: nn.Module, on_compute_done: Callable[[], None]) -> bool:
    """Under DDP, call ``on_compute_done`` when the last gradient bucket goes to the all-reduce.

    The hook is DDP's own default all-reduce (average over ranks, asynchronous) with a mark in
    front: gradients are unchanged. Returns whether it was installed (DDP only; FSDP2 has no
    such hook, its communication stays inside the forward and backward times).
    """
    if not isinstance(model, DistributedDataParallel):
        return False
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def timed_allreduce(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if bucket.is_last():
            on_compute_done()
        return allreduce_hook(state, bucket)

    # DDP checks the hook's annotations as objects; this module's are strings (postponed).
    timed_allreduce.__annotations__ = {
        "state": object,
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    model.register_comm_hook(None, timed_allreduce)
    return True


def buffers_broadcast(cfg: ParallelConfig, recipe_broadcasts_buffers: bool) -> bool:
    """Whether DDP broadcasts buffers: ``parallel.broadcast_buffers``, or the recipe's choice when null."""
    return cfg.broadcast_buffers if cfg.broadcast_buffers is not None else recipe_broadcasts_buffers


def sync_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's ``shared_buffers`` (BatchNorm running statistics) now.

    Without DDP's per-forward broadcast (``parallel.broadcast_buffers``, off for a DatasetRecipe)
    each rank's forwards update its own copy from its own batches, and with it the forward still
    updates them after the broadcast; FSDP2 and DeepSpeed leave buffers unsharded and never
    synchronise them. Evaluation and checkpoints call this first, whatever the switch, so the
    logged ``val_loss`` is that of the model the checkpoint holds, and every rank continues from
    rank 0's statistics in an uninterrupted run as after a resume (which loads rank 0's). Under a
    pipeline (a rank's stages, no wrapper) it does nothing.
    """
    if not (isinstance(model, DistributedDataParallel | FSDPModule) or is_engine(model)):
        return
    for buffer in shared_buffers(model):
        dist.broadcast(buffer, src=0)


def shared_buffers(model: nn.Module) -> list[torch.Tensor]:
    """The buffers each rank's training changes and a checkpoint holds: the persistent
    floating-point ones (BatchNorm's running mean and variance). Non-persistent ones (RoPE
    tables) are never saved and are the same on every rank by construction; integer ones
    (``num_batches_tracked``) count forwards, the same number on every rank."""
    return [
        buffer
        for module in unwrap(model).modules()
        for name, buffer in module.named_buffers(recurse=False)
        if buffer.is_floating_point() and name not in module._non_persistent_buffers_set
    ]


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under a DDP wrapper or DeepSpeed engine (FSDP2 shards in place)."""
    if isinstance(model, DistributedDataParallel) or is_engine(model):
        inner = model.module
        assert isinstance(inner, nn.Module)
        return inner
    return model


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter on non-final accumulation micro-steps."""
    if isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
        return
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
    if is_engine(model):
        # The engine reduces (and steps) at an accumulation boundary; the loop says where it is.
        model.set_gradient_accumulation_boundary(enabled)  # type: ignore[operator]
    yield


@dataclass(frozen=True)
class GradNorm:
    """How the global gradient norm is taken. ``over_world``: each rank adds the squares of its own
    pieces and one all-reduce sums the world (a pp x dp x tp mesh, where stages hold different
    parameters); ``plain_copies``: the ranks holding each plain (non-DTensor) gradient; ``skip``:
    ids of tied copies another stage counts."""

    over_world: bool = False
    plain_copies: int = 1
    skip: frozenset[int] = frozenset()

    @classmethod
    def of(cls, layout: Any, pipeline: Any) -> GradNorm:
        if layout.mesh is None:
            return cls()
        skip = frozenset(pipeline.not_in_norm()) if pipeline is not None else frozenset()
        return cls(over_world=True, plain_copies=layout.dp * layout.tp, skip=skip)


def optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    max_norm: float,
    measure: bool,
    norm: GradNorm = GradNorm(),
) -> torch.Tensor | None:
    """Unscale, clip to ``max_norm`` (> 0), update, zero the gradients; the gradient norm before
    clipping when clipping or ``measure`` asked for it (the same decision on every rank)."""
    if is_engine(model):
        model.step()  # type: ignore[operator]  # clips (gradient_clipping), steps and zeroes
        engine_norm = model.get_global_grad_norm()  # type: ignore[operator]
        return torch.tensor(float(engine_norm)) if measure and engine_norm is not None else None
    precision.unscale(optimizer)
    grad_norm = clip_grad_norm(model, max_norm, norm) if max_norm > 0 or measure else None
    precision.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def clip_grad_norm(model: nn.Module, max_norm: float, norm: GradNorm = GradNorm()) -> torch.Tensor:
    """Global gradient L2 norm (before clipping), correct for sharded FSDP2 gradients.

    Under FSDP2 each gradient is a DTensor shard; the norm of DTensors is a partial result that
    ``full_tensor()`` reduces over ranks, so every rank clips with the same global norm.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    if norm.over_world:
        settle_gradients(params)
        counted = [p.grad for p in params if p.grad is not None and id(p) not in norm.skip]
        total = _world_norm(counted, norm.plain_copies)
    else:
        total = _total_norm([p.grad for p in params if p.grad is not None])
    if max_norm > 0:
        # One foreach kernel per kind of tensor: plain ones, and DTensors by mesh and placements
        # (FSDP2 beside tensor parallelism puts a plan's weights on the 2-D mesh and the norms it
        # left alone on the dp mesh: one kernel over both raised "different meshes").
        for same in _by_layout(params).values():
            torch.nn.utils.clip_grads_with_norm_(same, max_norm, total)
    return total


def _by_layout(tensors: list[Any]) -> dict[Any, list[Any]]:
    groups: dict[Any, list[Any]] = {}
    for tensor in tensors:
        key = (tensor.device_mesh, tensor.placements) if isinstance(tensor, DTensor) else None
        groups.setdefault(key, []).append(tensor)
    return groups


def _total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all ``grads`` together. DTensors of different meshes or placements (tensor
    parallelism beside FSDP2, or parameters a plan left replicated) cannot meet in one foreach
    norm: each group's norm is reduced over its mesh, then the groups' squares are added."""
    norms = []
    for group in _by_layout(grads).values():
        norm = torch.nn.utils.get_total_norm(group, norm_type=2.0)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if len(norms) == 1:
        return norms[0]
    return torch.linalg.vector_norm(torch.stack(norms))


def settle_gradients(params: list[nn.Parameter]) -> None:
    """Lay each DTensor gradient out as its parameter is. Tensor parallelism leaves some partial
    (a sequence-parallel norm's weight: each rank's sum over its tokens) or replicated where the
    parameter is sharded; the optimizer would redistribute them anyway, and the norm below needs
    every local piece final."""
    for param in params:
        grad = param.grad
        if isinstance(grad, DTensor) and isinstance(param, DTensor) and grad.placements != param.placements:
            param.grad = grad.redistribute(param.device_mesh, param.placements)


def _world_norm(grads: list[torch.Tensor], plain_copies: int) -> torch.Tensor:
    """The L2 norm of gradients on a pp x dp x tp mesh in one all-reduce over the world: each rank
    adds the squares of its local pieces, each divided by the number of ranks that hold the same
    piece, so every element counts once; pipeline stages hold different parameters and simply add
    up. ``plain_copies`` ranks of a stage hold each parameter: a plain tensor whole on each, a
    DTensor in as many distinct pieces as its sharded mesh dimensions give. (Counting only the
    replicated dimensions of its own mesh missed the tp ranks holding a norm that FSDP2 sharded on
    the dp mesh alone.) DTensor's own reduction would all-reduce once per mesh dimension and per
    placement group."""
    device = grads[0].device if grads else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float32, device=device)
    for grad in grads:
        local, copies = grad, plain_copies
        if isinstance(grad, DTensor):
            local = grad.to_local()
            mesh = grad.device_mesh
            # Distinct pieces: its mesh dimensions that do not replicate it (FSDP2's _StridedShard
            # beside tensor parallelism is no Shard to is_shard()).
            pieces = math.prod(
                mesh.size(dim) for dim, p in enumerate(grad.placements) if not p.is_replicate()
            )
            copies = max(1, plain_copies // pieces)
        total += torch.linalg.vector_norm(local.float()).square() / copies
    dist.all_reduce(total)
    return total.sqrt()
