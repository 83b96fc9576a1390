"""torchvision's ResNet-18, with the stem chosen for the image size.

- ``resnet18`` (small images, 32x32 CIFAR or 28x28 MNIST): a 3x3 stride-1 first convolution and no
  max-pool, so layer1 sees the full resolution (the usual CIFAR adaptation; 0.56 GFLOPs forward
  per 32x32 image).
- ``resnet18-imagenet``: the original 7x7 stride-2 convolution + 3x3 stride-2 max-pool (a 4x
  smaller feature map from the start: about 16x fewer FLOPs on small images).

Everything after the stem is torchvision's model unchanged; ``in_channels`` adapts the first
convolution to grey-scale inputs.
"""

from __future__ import annotations

from torch import nn

VARIANTS = ("resnet18", "resnet18-imagenet")


def build_resnet18(variant: str, in_channels: int, num_classes: int) -> nn.Module:
    from torchvision.models import resnet18

    if variant not in VARIANTS:
        raise ValueError(f"unknown ResNet variant {variant!r} (known: {', '.join(VARIANTS)})")
    model = resnet18(weights=None, num_classes=num_classes)  # random init: nothing downloaded
    if variant == "resnet18":
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision does
    return model


def stages(model: nn.Module) -> list[nn.Module]:
    """The four residual stages: FSDP2's shard units."""
    return [model.layer1, model.layer2, model.layer3, model.layer4]  # type: ignore[list-item]
