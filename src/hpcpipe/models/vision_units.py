"""FSDP2's shard units of a torchvision classifier: blocks that each hold a share of the weights."""

from __future__ import annotations

from torch import nn


def shard_units(model: nn.Module) -> list[nn.Module]:
    """A ResNet's four stages (``layer1``..``layer4``); otherwise the children of the model's
    largest ``nn.Sequential``/``nn.ModuleList`` by parameter count, when it has several (a ViT's
    encoder layers, ConvNeXt's or EfficientNet's feature stages); else none (the model is one unit)."""
    stages = [getattr(model, f"layer{i}", None) for i in range(1, 5)]
    if all(isinstance(stage, nn.Module) for stage in stages):
        return [stage for stage in stages if isinstance(stage, nn.Module)]
    containers = [
        m for m in model.modules() if isinstance(m, nn.Sequential | nn.ModuleList) and m is not model
    ]
    if not containers:
        return []
    largest = max(containers, key=lambda m: sum(p.numel() for p in m.parameters()))
    blocks = [child for child in largest.children() if any(True for _ in child.parameters())]
    return blocks if len(blocks) > 1 else []
