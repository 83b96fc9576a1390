"""AdamW or SGD, with weight decay on matrices and convolution kernels only (not norms or biases)."""

from __future__ import annotations

import torch
from torch import nn

from hpcpipe.config import TrainConfig


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    # Weight decay on >= 2-D tensors (matmul weights, embeddings); none on biases and norm gains,
    # as in GPT-2/nanoGPT. Tied weights appear once in named_parameters().
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
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
