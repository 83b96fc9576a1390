"""Peak device FLOP/s and model FLOPs utilisation (MFU); the FLOPs per sample come from the recipe
(hpcpipe's GPT: ``models/gpt_flops.py``).

MFU = achieved model FLOP/s / peak FLOP/s of the device, with the *model* FLOPs counted
analytically (activation recomputation and other overheads not credited), as in PaLM
(Chowdhery et al. 2022, appendix B). A peak we do not know (CPU, an unlisted GPU) gives None:
better no MFU than a made-up one; ``observe.peak_tflops`` overrides the lookup.
"""

from __future__ import annotations

import re

import torch
from torch import nn

__all__ = [
    "PEAK_TFLOPS",
    "device_peak_flops",
    "mfu",
    "peak_flops_for_name",
    "peak_precision",
]

PRECISIONS = ("bf16", "fp16", "tf32", "fp32")


# ---------------------------------------------------------------------------------------------
# Peak dense TFLOP/s per device and precision. Dense = without 2:4 structured sparsity: NVIDIA
# datasheets print the sparse figure for tensor-core precisions, marked with an asterisk; the
# dense figure is half of it. fp32 is the non-tensor-core (CUDA core) rate, which is what plain
# fp32 matmuls get when TF32 is disabled. A device without a precision in hardware (V100: bf16)
# has no entry: MFU against an emulated path is not meaningful.

PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # NVIDIA H100 datasheet (SXM5): BF16/FP16 1,979*, TF32 989*, FP32 67.
    "H100 SXM": {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0},
    # NVIDIA H100 datasheet (PCIe): BF16/FP16 1,513*, TF32 756*, FP32 51.
    "H100 PCIe": {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0},
    # NVIDIA H100 datasheet (H100 NVL, per GPU): BF16/FP16 1,671*, TF32 835*, FP32 60.
    "H100 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    # NVIDIA GH200 datasheet: the Hopper GPU of the superchip has H100 SXM's compute.
    "GH200": {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0},
    # NVIDIA H200 datasheet (SXM): BF16/FP16 1,979*, TF32 989*, FP32 67 (H100 compute, more HBM).
    "H200": {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0},
    # NVIDIA H200 datasheet (H200 NVL): BF16/FP16 1,671*, TF32 835*, FP32 60.
    "H200 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    # NVIDIA A100 datasheet (SXM and PCIe, 40/80 GB): BF16/FP16 312 (624*), TF32 156 (312*), FP32 19.5.
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    # NVIDIA L40S datasheet: BF16/FP16 362.05 (733*), TF32 183 (366*), FP32 91.6.
    "L40S": {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6},
    # A10G (AWS G5 only; NVIDIA publishes no datasheet): the AWS-published figures, BF16/FP16 70,
    # TF32 35, FP32 35 (half the A10's tensor rate). Override with observe.peak_tflops if needed.
    "A10G": {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 35.0},
    # NVIDIA V100 datasheet: SXM2 FP16 tensor 125, FP32 15.7; PCIe 112 / 14; V100S PCIe 130 / 16.4.
    # No TF32 or BF16 tensor cores (tf32 requests fall back to the fp32 rate; bf16 has no peak).
    "V100 SXM": {"fp16": 125.0, "fp32": 15.7},
    "V100 PCIe": {"fp16": 112.0, "fp32": 14.0},
    "V100S PCIe": {"fp16": 130.0, "fp32": 16.4},
    # NVIDIA HGX B200 datasheet, per GPU (1,000 W): BF16/FP16 4.5 P*, TF32 2.2 P*, FP32 75.
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 75.0},
    # NVIDIA GB200 NVL72 datasheet, per GPU (1,200 W): BF16/FP16 5 P*, TF32 2.5 P*, FP32 80.
    "GB200": {"bf16": 2500.0, "fp16": 2500.0, "tf32": 1250.0, "fp32": 80.0},
}

# torch.cuda.get_device_name() -> table key. First match wins, so the more specific patterns come
# first. Word boundaries keep "GH200" from matching "H200" and "GB200" from matching "B200".
# Examples: "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB",
# "NVIDIA A100 80GB PCIe", "Tesla V100-SXM2-32GB", "Tesla V100S-PCIE-32GB", "NVIDIA B200".
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bGB200\b", "GB200"),
    (r"\bB200\b", "B200"),
    (r"\bGH200\b", "GH200"),
    (r"\bH200\b.*\bNVL\b", "H200 NVL"),
    (r"\bH200\b", "H200"),
    (r"\bH100\b.*\bNVL\b", "H100 NVL"),
    (r"\bH100\b.*\bPCIE\b", "H100 PCIe"),
    (r"\bH100\b", "H100 SXM"),
    (r"\bA100\b", "A100"),
    (r"\bL40S\b", "L40S"),
    (r"\bA10G\b", "A10G"),
    (r"\bV100S\b", "V100S PCIe"),
    (r"\bV100\b.*\bPCIE\b", "V100 PCIe"),
    (r"\bV100\b", "V100 SXM"),
)


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def peak_flops_for_name(device_name: str, precision: str) -> float | None:
    """Peak dense FLOP/s of a GPU model name (as CUDA reports it) at a precision; None if unknown."""
    _check_precision(precision)
    upper = device_name.upper()
    for pattern, key in _NAME_PATTERNS:
        if re.search(pattern, upper):
            peaks = PEAK_TFLOPS[key]
            if precision == "tf32" and "tf32" not in peaks:
                precision = "fp32"  # no TF32 tensor cores: fp32 matmuls run at the fp32 rate
            tflops = peaks.get(precision)
            return None if tflops is None else tflops * 1e12
    return None


def device_peak_flops(
    device: torch.device, precision: str, override_tflops: float | None = None
) -> float | None:
    """Peak dense FLOP/s of one device for MFU, or None when unknown (MFU is then not reported).

    ``override_tflops`` (``observe.peak_tflops``, in TFLOP/s) wins over everything. CUDA devices
    are looked up by ``torch.cuda.get_device_name``; CPU and other devices have no table entry.
    ``precision`` is the precision the matmuls run in: one of bf16, fp16, tf32, fp32 (see
    :func:`peak_precision` to derive it from ``train.precision``).
    """
    _check_precision(precision)
    if override_tflops is not None:
        if override_tflops <= 0:
            raise ValueError(f"peak TFLOP/s override must be positive, got {override_tflops}")
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    return peak_flops_for_name(torch.cuda.get_device_name(device), precision)


def peak_precision(train_precision: str, convolutions: bool = False) -> str:
    """The precision whose peak applies to a run with ``train.precision`` = fp32 / bf16 / fp16.

    fp32 training runs its matmuls on TF32 tensor cores when torch allows it
    (``torch.set_float32_matmul_precision("high")`` or ``allow_tf32``), and a model's
    ``convolutions`` when cuDNN does (``torch.backends.cudnn.allow_tf32``, on by default):
    compare with the TF32 peak then, or MFU would exceed 100 % (an H100's TF32 rate is 7x its
    FP32 rate). A net of convolutions and fp32 matmuls is held to the TF32 peak: its MFU is
    understated, never over 100 %.
    """
    if train_precision == "fp32" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    if train_precision == "fp32" and convolutions and torch.backends.cudnn.allow_tf32:
        return "tf32"
    _check_precision(train_precision)
    return train_precision


def has_convolutions(model: nn.Module) -> bool:
    """Whether ``model`` has convolution layers (cuDNN runs them, under its own TF32 switch)."""
    convs = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
    return any(isinstance(module, convs) for module in model.modules())


def mfu(tokens_per_s_per_device: float, flops_per_token: float, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1] (can exceed 1 only if the peak is wrong); None without a peak."""
    if peak_flops is None or peak_flops <= 0:
        return None
    return tokens_per_s_per_device * flops_per_token / peak_flops
