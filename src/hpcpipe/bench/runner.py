"""Run benchmark tasks on N ranks from the launching process: in-process, or local workers.

- under torchrun / srun / the Kubeflow operator this process *is* a rank: run in-process, and only
  rank 0 gets the results back;
- ``nproc == 1``: run in-process on a one-rank group;
- otherwise start ``nproc`` workers with the local elastic agent and read rank 0's result file.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hpcpipe.bench.worker import LOST_A_PEER
from hpcpipe.errors import USER_ERROR_EXIT_CODE, UserError
from hpcpipe.train.environment import detect_environment

WORKER_MODULE = "hpcpipe.bench.worker"


class BenchFailure(RuntimeError):
    """Benchmark workers failed; ``partial`` holds the tasks that finished before the failure."""

    def __init__(self, message: str, partial: dict[str, Any]) -> None:
        super().__init__(message)
        self.partial = partial


class BenchRefused(UserError):
    """Every rank refused a task's input (exit 2); ``partial`` holds the tasks that finished before."""

    def __init__(self, message: str, partial: dict[str, Any]) -> None:
        super().__init__(message)
        self.partial = partial


def run_bench(
    tasks: dict[str, dict[str, Any]], nproc: int, backend: str = "auto", timeout_s: float = 300.0
) -> dict[str, Any] | None:
    """Results of ``tasks`` (name -> spec) on rank 0; None on the other ranks of an external launch."""
    from hpcpipe.bench.worker import run_tasks

    spec = {"tasks": tasks, "backend": backend, "timeout_s": timeout_s}
    env = detect_environment()
    if env.is_external or nproc == 1:
        done: dict[str, Any] = {}
        try:
            return run_tasks(spec, env, on_result=done.update)
        except UserError as exc:
            raise BenchRefused(str(exc), done) from None
    return _run_local_workers(spec, nproc)


def prestart_bench_server(nproc: int, also: tuple[str, ...] = ()) -> None:
    """Fork the local workers' server from this process now, before it computes anything
    (``launch/fork_server.py``): ``bench collectives`` and ``accept`` call it first, and every
    later group of local workers forks from it instead of from a fresh interpreter that imports
    torch again. ``nproc``: the most local ranks any run will have; ``also``: more modules the
    server imports (``accept`` trains as well). Nothing to do for one rank (in-process) or under
    an external launcher (this process is a rank)."""
    if detect_environment().is_external or nproc <= 1:
        return
    from hpcpipe.launch.fork_server import prestart

    prestart((WORKER_MODULE, *also))


def world_size_for(nproc: int) -> int:
    """The world size a run will have: the external launcher's, else ``nproc``."""
    env = detect_environment()
    return env.world_size if env.is_external else nproc


def is_main_process() -> bool:
    """False on ranks other than 0 of an external launch (they print and write nothing)."""
    return detect_environment().rank == 0


def _run_local_workers(spec: dict[str, Any], nproc: int) -> dict[str, Any]:
    from hpcpipe.launch.local import launch_local

    with tempfile.TemporaryDirectory(prefix="hpcpipe-bench-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        code = launch_local(WORKER_MODULE, [str(spec_path), str(out_path)], nproc)
        partial = json.loads(out_path.read_text()) if out_path.is_file() else {}
        refused = sorted(Path(tmp).glob("result.json.rank*.refused"))
        if code == USER_ERROR_EXIT_CODE and refused:
            raise BenchRefused(refused[0].read_text().strip(), partial)
        if code != 0:
            errors = [p.read_text().strip() for p in sorted(Path(tmp).glob("result.json.rank*.error"))]
            errors.sort(key=lambda line: f": {LOST_A_PEER}: " in line)  # the cause before its victims
            reason = errors[0] if errors else "no rank reported a reason; see the worker output above"
            raise BenchFailure(f"benchmark workers failed (exit code {code}): {reason}", partial)
        return partial
