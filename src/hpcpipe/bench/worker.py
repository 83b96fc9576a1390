"""Worker entry point of distributed benchmarks: ``python -m hpcpipe.bench.worker SPEC.json OUT.json``.

Started on every rank by the local elastic agent (``--nproc``); under torchrun or srun the verb
itself calls :func:`run_tasks` in-process instead. Rank 0 rewrites OUT.json after each task, so a
later task's failure keeps the earlier results; a failing rank writes ``OUT.json.rank<R>.error``
with one line naming the failure, which the driver puts in its error message. The process leaves
through ``os._exit`` after flushing: gloo sometimes aborts at interpreter exit after
``destroy_process_group``, which would turn a finished benchmark into a failure.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcpipe.config import ParallelConfig
from hpcpipe.errors import USER_ERROR_EXIT_CODE, UserError, one_line
from hpcpipe.launch.exit import flush_and_exit, lost_a_peer_in_a_collective, return_or_exit
from hpcpipe.launch.fork_server import begin_forked_worker
from hpcpipe.train.environment import DistEnv, detect_environment, node_name

if TYPE_CHECKING:
    from hpcpipe.train.distributed import DistContext

TASKS = ("connectivity", "collectives", "compute")
LOST_A_PEER = "lost a peer"  # a victim's error line; the driver names another rank's first


def run_tasks(
    spec: dict[str, Any], env: DistEnv, on_result: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any] | None:
    """Run ``spec['tasks']`` in order as the rank ``env`` describes; rank 0 returns the results."""
    from hpcpipe.bench.group import bench_group

    parallel = ParallelConfig(backend=spec.get("backend", "auto"), timeout_s=spec.get("timeout_s", 300.0))
    results: dict[str, Any] = {}
    with bench_group(parallel, env) as ctx:
        for name, task in spec["tasks"].items():
            outcome = _run_task(name, task, ctx)
            if ctx.is_main:
                results[name] = outcome
                if on_result is not None:
                    on_result(results)
    return results if env.rank == 0 else None


def _run_task(name: str, task: dict[str, Any], ctx: DistContext) -> dict[str, Any] | None:
    if name == "connectivity":
        from hpcpipe.bench.connectivity import run_connectivity

        return run_connectivity(ctx)
    if name == "collectives":
        from hpcpipe.bench.collectives import CollectiveSpec, run_collectives

        return run_collectives(CollectiveSpec(**task), ctx)
    if name == "compute":
        return _compute_every_rank(task, ctx)
    raise ValueError(f"unknown benchmark task {name!r} (known: {', '.join(TASKS)})")


def _compute_every_rank(task: dict[str, Any], ctx: DistContext) -> dict[str, Any] | None:
    """Every rank measures its own device at the same time (as a training job loads them)."""
    import torch.distributed as dist

    from hpcpipe.bench.compute import ComputeSpec, measure_compute

    dist.barrier()
    mine = measure_compute(ComputeSpec(**task), ctx.device)
    mine.update(rank=ctx.rank, host=node_name())
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, mine)
    return {"world_size": ctx.world_size, "ranks": gathered} if ctx.is_main else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> None:
    """``python -m hpcpipe.bench.worker SPEC.json OUT.json``."""
    flush_and_exit(run(sys.argv[1:] if argv is None else argv))


def forked_main(*args: str) -> None:
    """A worker forked from the local agent's fork server (``launch/agent.py``)."""
    begin_forked_worker()
    return_or_exit(run(list(args)))


def run(args: list[str]) -> int:
    """Run the spec's tasks as this rank; 0, or 1 after writing the error next to OUT.json (2
    after writing ``OUT.json.rank<R>.refused``: input every rank refuses, --sizes beyond memory)."""
    env = detect_environment()
    code = 0
    try:
        if len(args) != 2:
            raise ValueError("usage: python -m hpcpipe.bench.worker SPEC.json OUT.json")
        out = Path(args[1])
        spec = json.loads(Path(args[0]).read_text())
        run_tasks(spec, env, on_result=lambda results: _write_json(out, results))
    except UserError as exc:  # every rank refuses the same input: no traceback, exit 2
        if len(args) == 2:  # each rank: the agent may stop the others before they write
            Path(f"{args[1]}.rank{env.rank}.refused").write_text(one_line(str(exc)) + "\n")
        code = USER_ERROR_EXIT_CODE
    except BaseException as exc:
        victim = lost_a_peer_in_a_collective(exc)  # the rank that failed prints its own traceback
        if victim:
            print(f"rank {env.rank}: {LOST_A_PEER} ({one_line(str(exc))})", file=sys.stderr, flush=True)
        else:
            import traceback

            traceback.print_exc()
        if len(args) == 2:
            what = LOST_A_PEER if victim else type(exc).__name__
            message = f"rank {env.rank} on {node_name()}: {what}: {exc}"
            Path(f"{args[1]}.rank{env.rank}.error").write_text(message.splitlines()[0] + "\n")
        code = 1
    return code


if __name__ == "__main__":
    main()
