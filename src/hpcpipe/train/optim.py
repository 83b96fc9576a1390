"""AdamW or SGD, with weight decay on matrices and convolution kernels only (not norms or biases)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from hpcpipe.config import TrainConfig


def _mixes_dtensors(params: list[nn.Parameter]) -> bool:
    kinds = {isinstance(p, DTensor) for p in params}
    return len(kinds) > 1


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    # Weight decay on >= 2-D tensors (matmul weights, embeddings); none on biases and norm gains,
    # as in GPT-2/nanoGPT. Tied weights appear once in named_parameters().
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups: list[dict[str, Any]] = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if _mixes_dtensors(decay + no_decay):
        # A tensor-parallel plan that leaves some parameters plain (a Hugging Face model's norms):
        # the multi-tensor kernels take one kind per call, and they run per group.
        groups = [
            {**group, "params": [p for p in group["params"] if isinstance(p, DTensor) == sharded]}
            for sharded in (False, True)
            for group in groups
        ]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.momentum > 0)
    return torch.optim.AdamW(
        groups,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        # The fused CUDA kernel is fastest on GPU; on CPU the foreach path is.
        fused=device.type == "cuda",
    )


@contextlib.contextmanager
def config_settings_kept(optimizer: Any) -> Iterator[None]:
    """Around a checkpoint's restore: each param group keeps the settings built from this job's
    config (weight decay, betas, momentum, ...). A checkpoint's groups hold those it trained with:
    a run continued with a changed train.weight_decay, beta1, beta2 or momentum trained on with
    the old values while config.yaml recorded the new ones. The groups are matched in order, as
    the restore matches them (built, then loaded, from the same model); lr is set every step."""
    built = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    yield
    if len(optimizer.param_groups) == len(built):  # read again: a restore may replace the groups
        for group, settings in zip(optimizer.param_groups, built, strict=True):
            group.update(settings)
