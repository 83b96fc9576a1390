"""FLOPs per token, the device peak table and MFU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpcpipe.config import ModelConfig
from hpcpipe.models.gpt import GPT
from hpcpipe.models.gpt_flops import matmul_params, training_flops_per_token
from hpcpipe.observe import flops
from hpcpipe.observe.flops import device_peak_flops, mfu, peak_flops_for_name, peak_precision

VOCAB = 100


def tiny(variant: str) -> ModelConfig:
    return ModelConfig.model_validate(
        {"variant": variant, "n_layers": 2, "n_heads": 2, "d_model": 32, "seq_len": 16}
    )


def test_flops_per_token_gpt2_by_hand() -> None:
    # L=2, C=32, T=16, V=100, MLP width 128.
    n = 2 * (4 * 32 * 32 + 2 * 32 * 128) + 100 * 32  # blocks + LM head = 27_776
    assert matmul_params(tiny("gpt2"), VOCAB) == n == 27_776
    expected = 6 * n + 12 * 2 * 32 * 16  # 166_656 + 12_288
    assert training_flops_per_token(tiny("gpt2"), VOCAB) == expected == 178_944


def test_flops_per_token_llama_by_hand() -> None:
    n = 2 * (4 * 32 * 32 + 3 * 32 * 128) + 100 * 32  # SwiGLU width 128: 35_968
    assert training_flops_per_token(tiny("llama"), VOCAB) == 6 * n + 12 * 2 * 32 * 16 == 228_096


@pytest.mark.parametrize("variant", ["gpt2", "llama"])
def test_matmul_params_agree_with_the_model(variant: str) -> None:
    model = GPT(tiny(variant), VOCAB)
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert matmul_params(tiny(variant), VOCAB) == linear_weights  # includes the tied lm_head


def test_override_wins() -> None:
    assert device_peak_flops(torch.device("cpu"), "bf16", override_tflops=100.0) == 100e12
    with pytest.raises(ValueError, match="positive"):
        device_peak_flops(torch.device("cpu"), "bf16", override_tflops=0.0)


def test_cpu_has_no_peak() -> None:
    assert device_peak_flops(torch.device("cpu"), "fp32") is None


def test_known_gpu_name_is_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flops.torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert device_peak_flops(torch.device("cuda", 0), "bf16") == pytest.approx(989.5e12)
    assert device_peak_flops(torch.device("cuda", 0), "tf32") == pytest.approx(494.5e12)
    assert device_peak_flops(torch.device("cuda", 0), "bf16", override_tflops=1.0) == 1e12


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA H100 PCIe", "bf16", 756.5),
        ("NVIDIA H100 NVL", "fp16", 835.5),
        ("NVIDIA H200", "bf16", 989.5),
        ("NVIDIA H200 NVL", "bf16", 835.5),
        ("NVIDIA GH200 480GB", "fp32", 67.0),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100 80GB PCIe", "tf32", 156.0),
        ("NVIDIA L40S", "bf16", 362.05),
        ("NVIDIA A10G", "bf16", 70.0),
        ("Tesla V100-SXM2-32GB", "fp16", 125.0),
        ("Tesla V100-PCIE-16GB", "tf32", 14.0),  # no TF32 tensor cores: the fp32 rate
        ("Tesla V100S-PCIE-32GB", "fp16", 130.0),
        ("NVIDIA B200", "bf16", 2250.0),
        ("NVIDIA GB200", "bf16", 2500.0),
    ],
)
def test_peak_table_lookup(name: str, precision: str, tflops: float) -> None:
    assert peak_flops_for_name(name, precision) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize(
    ("name", "precision"),
    [("NVIDIA GeForce RTX 4090", "bf16"), ("NVIDIA A10", "bf16"), ("Tesla V100-SXM2-16GB", "bf16")],
)
def test_unknown_device_or_precision_has_no_peak(name: str, precision: str) -> None:
    assert peak_flops_for_name(name, precision) is None


def test_bad_precision_is_an_error() -> None:
    with pytest.raises(ValueError, match="precision"):
        peak_flops_for_name("NVIDIA H100", "int8")


def test_peak_precision_follows_tf32_setting() -> None:
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert peak_precision("fp32") == "fp32"
        torch.set_float32_matmul_precision("high")
        assert peak_precision("fp32") == "tf32"
        assert peak_precision("bf16") == "bf16"
    finally:
        torch.set_float32_matmul_precision(before)


def test_an_fp32_conv_net_is_held_to_the_tf32_peak_while_cudnn_allows_tf32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cuDNN runs fp32 convolutions on TF32 tensor cores by default: divided by the FP32 peak
    (an H100's 67 against 494 TFLOP/s), a conv net's MFU read up to 7x too high."""
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    conv_net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    assert flops.has_convolutions(conv_net) and not flops.has_convolutions(torch.nn.Linear(2, 2))
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert peak_precision("fp32", convolutions=True) == "tf32"
    assert peak_precision("fp32", convolutions=False) == "fp32"  # matmuls only: FP32 at "highest"
    assert peak_precision("bf16", convolutions=True) == "bf16"
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert peak_precision("fp32", convolutions=True) == "fp32"


def test_mfu() -> None:
    assert mfu(1000.0, 6e9, 1e13) == pytest.approx(0.6)
    assert mfu(1000.0, 6e9, None) is None
