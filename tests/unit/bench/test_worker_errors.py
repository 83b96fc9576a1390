"""A benchmark worker that lost its peer says so in one line, and the driver names the rank that
failed first, not its victim (rank 0, whose collective lost rank 1, came first by rank order)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpcpipe.bench import runner, worker

GLOO_RESET = "[pair.cc:545] Read error [127.0.0.1]:35203: Connection reset by peer. This is typically ..."


def in_a_collective(
    message: str, name: str = "broadcast", file: str = "distributed/distributed_c10d.py"
) -> Any:
    """A function raising ``message`` from a frame of torch's ``file`` (as a collective whose
    peer went away does), so the worker tells it from its own connections'."""
    namespace: dict[str, Any] = {}
    code = f"def {name}(*args, **kwargs):\n    raise RuntimeError({message!r})\n"
    exec(compile(code, f"/site-packages/torch/{file}", "exec"), namespace)
    return namespace[name]


def test_only_a_collectives_lost_peer_is_a_victims() -> None:
    """An HTTP or DataLoader "Connection reset by peer", or a store unreachable while the group
    forms, is this rank's own failure: it keeps its traceback."""
    from hpcpipe.launch.exit import lost_a_peer, lost_a_peer_in_a_collective

    def caught(call: Any) -> BaseException:
        try:
            call()
        except BaseException as exc:
            return exc
        raise AssertionError("no exception")

    def own() -> None:
        raise ConnectionResetError(104, "Connection reset by peer")

    assert lost_a_peer_in_a_collective(caught(in_a_collective(GLOO_RESET)))
    assert lost_a_peer(caught(own)) and not lost_a_peer_in_a_collective(caught(own))
    forming = in_a_collective(GLOO_RESET, name="init_process_group")
    assert not lost_a_peer_in_a_collective(caught(forming))
    store = in_a_collective(GLOO_RESET, name="next_rendezvous", file="distributed/elastic/rendezvous/x.py")
    assert not lost_a_peer_in_a_collective(caught(store))
    # DDP's gradient all-reduce fails inside the backward; FSDP2's waits in its own files.
    ddp = in_a_collective(GLOO_RESET, name="run_backward", file="autograd/graph.py")
    assert lost_a_peer_in_a_collective(caught(ddp))
    fsdp = in_a_collective(GLOO_RESET, name="wait", file="distributed/fsdp/_fully_shard/_fsdp_collectives.py")
    assert lost_a_peer_in_a_collective(caught(fsdp))

    def dcp_wrapped() -> None:  # DCP raises its own exception from the collective's
        try:
            in_a_collective(GLOO_RESET)()
        except RuntimeError as exc:
            raise ValueError("CheckpointException ranks:{1}") from exc

    assert lost_a_peer_in_a_collective(caught(dcp_wrapped))
    assert not lost_a_peer_in_a_collective(caught(in_a_collective("shape mismatch")))


def test_a_victim_writes_one_line_and_no_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(worker, "run_tasks", in_a_collective(GLOO_RESET))
    spec, out = tmp_path / "spec.json", tmp_path / "result.json"
    spec.write_text(json.dumps({"tasks": {}}))
    assert worker.run([str(spec), str(out)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("rank 0: lost a peer ([pair.cc:545]"), err
    assert ": lost a peer: [pair.cc:545]" in (tmp_path / "result.json.rank0.error").read_text()


def test_the_driver_names_the_cause_before_its_victim(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcpipe.launch import local

    def two_failed_ranks(_module: str, args: list[str], _nproc: int) -> int:
        Path(f"{args[1]}.rank0.error").write_text(f"rank 0 on n1: lost a peer: {GLOO_RESET}\n")
        Path(f"{args[1]}.rank1.error").write_text("rank 1 on n1: MemoryError: out of memory\n")
        return 1

    monkeypatch.setattr(local, "launch_local", two_failed_ranks)
    with pytest.raises(runner.BenchFailure, match=r"\(exit code 1\): rank 1 on n1: MemoryError"):
        runner.run_bench({"collectives": {}}, nproc=2)
