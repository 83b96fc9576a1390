"""``hpcpipe bench collectives``' default rank count (``cli/bench.py``): found without a CUDA
context in the process its workers fork from (``torch.cuda.is_available()`` would leave them
unable to use CUDA)."""

from __future__ import annotations

import pytest
import torch

from hpcpipe.cli import bench as bench_cli
from hpcpipe.train import environment


def _no_cuda_context() -> bool:
    raise AssertionError("torch.cuda.is_available() initialises CUDA in the process workers fork from")


def test_a_cpu_host_gets_two_ranks_without_asking_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", _no_cuda_context)
    monkeypatch.setattr(environment, "gpu_device_present", lambda: False)
    assert bench_cli._default_nproc() == 2


def test_a_gpu_node_gets_one_rank_per_gpu_counted_without_a_cuda_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", _no_cuda_context)
    monkeypatch.setattr(environment, "gpu_device_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert bench_cli._default_nproc() == 8
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # CUDA_VISIBLE_DEVICES="": the CPU's two
    assert bench_cli._default_nproc() == 2
