"""``train.activation_checkpointing``: recompute each block's activations in backward.

Autograd keeps every intermediate a backward needs until that backward runs; for a transformer
that is about ``34 * B * T * C`` bytes per layer in 16-bit (Korthikanti et al. 2022), more than the
weights at long sequences. Checkpointing a block keeps only what its policy saves and reruns the
block's forward when its backward needs the rest:

- ``full``: nothing inside the block is kept, only its input (one more forward per step).
- ``selective``: the outputs of matmuls and attention are kept (the expensive ops), everything
  element-wise between them (norms, activations, RoPE, dropout) is recomputed: most of the
  memory of ``full`` for a few percent of compute (the "selective" of Korthikanti et al.,
  torchtitan's per-op policy).

Applied to the recipe's blocks (``Recipe.shard_units``) by replacing each block's ``forward`` on the
instance: the module tree, parameter names and checkpoints stay as they were, and FSDP2's hooks
(on the module call) still gather the block's parameters before the recomputation. Random ops
replay: ``torch.utils.checkpoint`` restores the RNG state for the recomputation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from hpcpipe import compat
from hpcpipe.errors import ConfigError


def apply_activation_checkpointing(units: Sequence[nn.Module], mode: str) -> None:
    """Checkpoint every block in ``units`` with ``mode`` (``none`` leaves them alone)."""
    if mode == "none":
        return
    if not units:
        raise ConfigError(
            f"train.activation_checkpointing={mode}: the recipe names no blocks to checkpoint "
            "(Recipe.shard_units returns none); set it to none"
        )
    context_fn = _selective_contexts if mode == "selective" else None
    for unit in units:
        unit.forward = functools.partial(_checkpointed, unit.forward, context_fn)


def _checkpointed(
    forward: Callable[..., Any], context_fn: Callable[[], Any] | None, *args: Any, **kwargs: Any
) -> Any:
    from torch.utils.checkpoint import checkpoint, noop_context_fn

    return checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn or noop_context_fn, **kwargs)


def _selective_contexts() -> Any:
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    saved = _saved_ops()

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


@functools.cache
def _saved_ops() -> frozenset[Any]:
    """The ops whose outputs selective checkpointing keeps: matmuls, attention kernels and
    collectives (the names each torch build has; the attention kernel differs per device)."""
    import torch

    aten = torch.ops.aten
    names = (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "convolution",
    )
    ops = {getattr(aten, name).default for name in names if hasattr(aten, name)}
    # Tensor parallelism's collectives inside a block: kept, so recomputing does not communicate.
    ops.update(compat.functional_collective_ops())
    return frozenset(ops)
