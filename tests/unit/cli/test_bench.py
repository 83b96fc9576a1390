"""``hpcpipe bench collectives``' default rank count (``cli/bench.py``): found without a CUDA
context in the process its workers fork from (``torch.cuda.is_available()`` would leave them
unable to use CUDA)."""

from __future__ import annotations

from pathlib import Path

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


def _refused(args: list[str]) -> str:
    """The UserError ``bench collectives ARGS`` raises before it starts a worker (the main app
    prints it as one line, exit 2)."""
    from typer.testing import CliRunner

    from hpcpipe.errors import UserError

    result = CliRunner().invoke(bench_cli.app, ["collectives", "--nproc", "2", *args])
    assert isinstance(result.exception, UserError), result.output
    return str(result.exception)


def test_bad_options_are_refused_before_any_worker_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from hpcpipe.bench import runner

    monkeypatch.setattr(runner, "prestart_bench_server", _no_cuda_context)  # nothing may start
    monkeypatch.setattr(environment, "gpu_device_present", lambda: False)
    assert "--timeout-s" in _refused(["--timeout-s", "0"])
    assert "--backend nccl needs CUDA GPUs" in _refused(["--backend", "nccl"])
    assert "/proc/x.png" in _refused(["--plot", "/proc/x.png"])  # procfs takes no new file
    assert f"{tmp_path}: is a directory" in _refused(["--json", str(tmp_path)])
    (tmp_path / "file").write_text("")
    assert "not a directory" in _refused(["--json", str(tmp_path / "file" / "out.json")])


def test_an_existing_writable_output_file_passes_whatever_its_folder() -> None:
    """/dev/null, and a shell's >(jq .) (/dev/fd/N): a file exists there and can be written,
    though no new file can be made in /dev or /dev/fd."""
    import os

    from hpcpipe.cli.common import writable_output

    assert writable_output("/dev/null") == "/dev/null"
    read, write = os.pipe()
    try:
        assert writable_output(f"/dev/fd/{write}") == f"/dev/fd/{write}"
    finally:
        os.close(read)
        os.close(write)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("xpu", "--device xpu: bench compute measures auto, cpu or cuda[:N] only"),  # was an AssertionError
        ("meta", "--device meta: bench compute measures"),  # was 290 TB/s of nothing copied
        ("cuda:2", "--device cuda:2: this machine has cuda:0 to cuda:1"),
        ("nonsense", "--device: cannot read 'nonsense'"),
    ],
)
def test_compute_takes_only_cpu_and_present_cuda_devices(
    monkeypatch: pytest.MonkeyPatch, text: str, needle: str
) -> None:
    from hpcpipe.errors import UserError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UserError) as exc:
        bench_cli._device(text, torch)
    assert str(exc.value).startswith(needle)
    assert bench_cli._device("cuda", torch) == torch.device("cuda", 0)
    assert bench_cli._device("cuda:1", torch) == torch.device("cuda", 1)
    assert bench_cli._device("cpu", torch) == torch.device("cpu")


def test_a_row_that_could_not_be_checked_reads_n_a_with_why() -> None:
    """It read "ok" (bf16 all_to_all at 1 element a chunk); -- stays --no-check's mark."""
    from rich.console import Console

    def row(size: int, correct: bool | None, unchecked: str | None = None) -> dict:
        return {
            "collective": "all_to_all",
            "size_bytes": size,
            "time_s": 1e-5,
            "algbw_gbps": 0.1,
            "busbw_gbps": 0.1,
            "correct": correct,
            "wrong_ranks": [],
            "slowest_rank": 0,
            "slow_ranks": [],
            "unchecked": unchecked,
        }

    rows = [row(32, None, "too short"), row(64, None, "too short"), row(128, True), row(256, None)]
    result = {"world_size": 16, "backend": "gloo", "device": "cpu", "dtype": "bfloat16", "iters": 1}
    view = Console(record=True, width=200)
    bench_cli._print_collectives({**result, "results": rows}, view)
    lines = view.export_text().splitlines()
    checks = [line.split("│")[6].strip() for line in lines if line.startswith("│ all_to_all")]
    assert checks == ["n/a", "n/a", "ok", "-"]
    assert lines[-1] == "check n/a: all_to_all at 32B, 64B: too short"
