"""The chaos suite's security kinds pass on the product, replay from their seed, and can fail: a
traceback, a file written outside the sandbox, a payload that runs, a leaked secret and a server
bound beyond loopback are each caught."""

from __future__ import annotations

import io
import ipaddress
import os
import pickle
import socket
import subprocess
from pathlib import Path

import pytest
import torch

from hpcpipe.chaos import fuzz, security
from hpcpipe.chaos.forge import Payload, forge_checkpoint, forge_cifar
from hpcpipe.chaos.scenario import Scenario, TrialContext, TrialResult, trial_rng
from hpcpipe.chaos.sockets import Listener, _decode, classify, listening_sockets, violations
from hpcpipe.checkpoint import CheckpointStore
from hpcpipe.config import CheckpointConfig, ModelConfig
from hpcpipe.models.gpt import GPT

pytestmark = [pytest.mark.timeout(300)]


def _root_command() -> object:
    """The hpcpipe CLI's click command, as `hpcpipe chaos run` passes it to the fuzz kinds."""
    import typer.main

    from hpcpipe.cli.app import app

    return typer.main.get_command(app)


def _ctx(tmp_path: Path, kind: str, nproc: int = 1, folder: str = "work", **params: object) -> TrialContext:
    scenario = Scenario(name=kind.replace("_", "-"), kind=kind, nproc=nproc, params=params)
    work, shared = tmp_path / folder, tmp_path / "shared"
    work.mkdir(parents=True)
    shared.mkdir(exist_ok=True)
    return TrialContext(scenario, 0, 0, trial_rng(0, scenario.name, 0), work, shared, cli=_root_command())


def _passed(result: TrialResult) -> bool:
    assert result.recovered, result.detail
    assert result.lost == 0 and result.ttr_s is None
    return True


# -- fuzz_config -------------------------------------------------------------------------------


def test_fuzzed_configs_pass_and_replay_from_the_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = security.fuzz_config(_ctx(tmp_path, "fuzz_config", cases=150))
    assert _passed(first)
    assert sum(first.placement["categories"].values()) == 150
    assert set(first.placement["categories"]) == set(fuzz.CATEGORIES)
    # The replay: the placement (every case's arguments and files, the subprocess sample) is drawn
    # from the seed before any case runs, so the second trial only draws it (the first ran them all).
    ran: list[int] = []

    def draw_only(
        cli: object, cases: list[fuzz.FuzzCase], *rest: object
    ) -> tuple[list[fuzz.Outcome], list[object]]:
        ran.append(len(cases))
        return [fuzz.Outcome(0, "", "") for _ in cases], []

    monkeypatch.setattr(security, "_run_cases", draw_only)
    monkeypatch.setattr(security, "_replay_as_subprocesses", lambda *args: [])
    again = security.fuzz_config(_ctx(tmp_path, "fuzz_config", folder="again", cases=150))
    assert ran == [150] and again.placement == first.placement


def test_a_traceback_fails_the_fuzz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug, not bad input")

    monkeypatch.setattr("hpcpipe.cli.presets.load_config", broken)  # `presets show` crashes
    result = security.fuzz_config(_ctx(tmp_path, "fuzz_config", cases=40))
    assert not result.recovered and result.lost >= 1
    assert "uncaught exception: RuntimeError: a bug, not bad input" in result.detail
    assert "args: presets show" in result.detail


def test_a_file_written_outside_the_sandbox_fails_the_fuzz(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcpipe.cli import presets

    real = presets.load_config

    def escaping(*args: object, **kwargs: object) -> object:
        Path("../../stray.txt").write_text("escaped")  # from the sandbox root: two levels up
        return real(*args, **kwargs)

    monkeypatch.setattr(presets, "load_config", escaping)
    result = security.fuzz_config(_ctx(tmp_path, "fuzz_config", cases=40))
    assert not result.recovered
    assert f"wrote outside the sandbox root: {tmp_path / 'work' / 'stray.txt'}" in result.detail


def test_the_verdict_of_one_case() -> None:
    case = fuzz.FuzzCase(0, "unicode", ("presets", "show", "x.yaml"))
    assert fuzz.judge(case, fuzz.Outcome(2, "", "error: x.yaml: not valid YAML\n")) is None
    assert fuzz.judge(case, fuzz.Outcome(0, "run:\n", "")) is None
    usage = (
        "Usage: python -m hpcpipe train [OPTIONS]\nTry 'python -m hpcpipe train -h' for help.\n╭─ Error ─╮\n"
    )
    assert fuzz.judge(case, fuzz.Outcome(2, "", usage)) is None
    assert "2 stderr lines" in str(fuzz.judge(case, fuzz.Outcome(2, "", "error: a\nsecond line\n")))
    assert "exit 1" in str(fuzz.judge(case, fuzz.Outcome(1, "", "error: x\n")))
    assert "traceback" in str(fuzz.judge(case, fuzz.Outcome(2, "", "Traceback (most recent call last):\n")))


def test_yaml_tags_carry_a_live_payload(tmp_path: Path) -> None:
    """The tags would run if a config were read with an unsafe loader: the check is not vacuous."""
    import yaml

    targets = fuzz.FuzzTargets("feed", tmp_path / "markers", tmp_path / "outside")
    targets.markers.mkdir()
    tag = fuzz.YAML_TAGS[0].format(sh=f'"touch {targets.marker(3)}"', q="", py="")
    yaml.unsafe_load(f"steps: {tag}\n")
    assert targets.marker(3).exists()


# -- malicious_pickle --------------------------------------------------------------------------


@pytest.mark.slow
def test_malicious_pickles_are_refused_and_replay(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, "malicious_pickle")
    result = security.malicious_pickle(ctx)
    assert _passed(result)
    assert result.placement == security.draw_pickle(trial_rng(0, ctx.scenario.name, 0))
    assert not list(ctx.work.glob("pwned-*"))


@pytest.fixture
def committed(tmp_path: Path) -> Path:
    model = GPT(ModelConfig(n_layers=1, d_model=16, n_heads=2, seq_len=8), 32)
    store = CheckpointStore(CheckpointConfig(), tmp_path / "ckpts")
    store.save(1, model, torch.optim.AdamW(model.parameters()), {"step": 1})
    store.close()
    return tmp_path / "ckpts" / "step-00000001"


@pytest.mark.parametrize("place", ["metadata", "trainer_state", "byte_item"])
def test_forged_checkpoints_verify_and_carry_a_live_payload(
    committed: Path, tmp_path: Path, place: str
) -> None:
    """The forgery passes the hash check and would run if unpickled unsafely: refusing it means
    something."""
    from hpcpipe.checkpoint.manifest import verify_dir

    marker = tmp_path / "pwned"
    forged = forge_checkpoint(committed, place, Payload("os.system", str(marker)), 0.5, 2)
    assert verify_dir(committed)[1] == []
    data = forged.read_bytes()
    if place == "byte_item":  # the payload was appended: it starts at the highest offset in the shard
        data = data[max(_offsets(committed, forged)) :]
    if place == "metadata":
        pickle.loads(data)
    else:
        torch.load(io.BytesIO(data), weights_only=False)
    assert marker.exists()


def _offsets(ckpt: Path, shard: Path) -> list[int]:
    from hpcpipe.checkpoint.safe_dcp import safe_load_metadata

    with (ckpt / ".metadata").open("rb") as handle:
        metadata = safe_load_metadata(handle, "test")
    return [info.offset for info in metadata.storage_data.values() if info.relative_path == shard.name]


def test_a_forged_cifar_batch_carries_a_live_payload(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = forge_cifar(
        tmp_path / "cifar", "data_batch_1", Payload("builtins.exec", str(marker)), "data", 0, 2
    )
    assert (tmp_path / "cifar" / "cifar-10-batches-py" / "batches.meta").is_file()
    pickle.loads(path.read_bytes())
    assert marker.exists()


def test_a_refusal_is_checked_precisely(tmp_path: Path) -> None:
    from hpcpipe.chaos.checks import Checks

    forged = tmp_path / ".metadata"

    def verdict(code: int, stderr: str, ranks: int = 1) -> list[str]:
        checks = Checks()
        security._check_refusal(checks, subprocess.CompletedProcess([], code, "", stderr), forged, ranks, "x")
        return checks.failures

    assert verdict(2, f"error: {forged}: unsafe or corrupt DCP metadata (refusing)\n") == []
    assert verdict(0, "") != []  # loaded
    assert verdict(2, "error: something else\n") != []  # does not name the file
    assert verdict(2, f"Traceback (most recent call last):\nerror: {forged}: unsafe\n") != []
    assert verdict(2, f"error: {forged}: unsafe (Weights only load failed.\n\nmore advice)\n") != []
    group = (
        f"error: {forged}: unsafe\nerror: {forged}: unsafe\n"
        "E1124 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2) local_rank: 0\n"
        "agent: worker rank 0 (local rank 0, pid 1) failed with exit code 2; the group gave up\n"
        "error: a worker rejected the job (see its message above); run dir: runs/x\n"
    )
    assert verdict(2, group, ranks=2) == []
    assert verdict(2, group.replace("exit code 2", "exit code 1"), ranks=2) != []


# -- secrets_stay_hidden -----------------------------------------------------------------------


@pytest.mark.slow
def test_secrets_stay_hidden_and_replay(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, "secrets")
    result = security.secrets_stay_hidden(ctx)
    assert _passed(result)
    assert result.placement == security.draw_secrets(trial_rng(0, ctx.scenario.name, 0))[1]


def test_a_secret_in_a_log_file_or_an_auth_header_is_found(tmp_path: Path) -> None:
    import base64

    secret = "Zq9xTOKEN0123456789abcd"
    forms = security._secret_forms(secret)
    (tmp_path / "run" / "logs").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("run:\n  name: x\n")
    (tmp_path / "run" / "logs" / "train.log").write_text(f"connecting to http://chaos:{secret}@db\n")
    header = base64.b64encode(f"chaos:{secret}".encode()).decode()
    (tmp_path / "run" / "events.bin").write_bytes(b"\x00Authorization: Basic " + header.encode())
    assert security._files_holding(tmp_path, forms) == ["run/events.bin", "run/logs/train.log"]


# -- loopback_only -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.distributed
def test_every_socket_a_local_run_listens_on_is_on_loopback(tmp_path: Path) -> None:
    result = security.loopback_only(_ctx(tmp_path, "loopback_only", nproc=2))
    assert _passed(result)
    assert "hpcpipe prometheus exporter 127.0.0.1:" in result.detail
    assert "torch c10d rendezvous store (agent) 127.0.0.1:" in result.detail  # torch's, found: checked
    base = result.placement["port_base"]
    assert f"127.0.0.1:{base}" in result.detail and f"127.0.0.1:{base + 1}" in result.detail


def test_the_port_draw_replays() -> None:
    from hpcpipe.chaos.sockets import free_port_base

    assert free_port_base(trial_rng(0, "loopback-only", 0), 2) == free_port_base(
        trial_rng(0, "loopback-only", 0), 2
    )


@pytest.mark.parametrize(("family", "address"), [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")])
def test_a_server_bound_beyond_loopback_is_caught(family: socket.AddressFamily, address: str) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as wide, socket.socket() as local:
        wide.bind((address, 0))
        wide.listen()
        local.bind(("127.0.0.1", 0))
        local.listen()
        ports = {wide.getsockname()[1], local.getsockname()[1]}
        found = [s for s in listening_sockets([os.getpid()]) if s.port in ports]
        owned = classify(found, exporters=ports, launcher=-1, ranks={})  # as if hpcpipe's exporters
    assert {(s.address, s.owner) for s in owned} == {(address, "hpcpipe"), ("127.0.0.1", "hpcpipe")}
    assert [s.address for s in violations(owned)] == [address]


def test_listeners_are_attributed_to_torch_by_process_and_port() -> None:
    listeners = [
        Listener(10, "::", 29400),  # the launcher: the agent's rendezvous store, as torch binds it
        Listener(11, "127.0.0.1", 40000),  # rank 0 on MASTER_PORT
        Listener(11, "127.0.0.1", 40001),  # gloo
        Listener(11, "127.0.0.1", 9100),  # the exporter
        Listener(12, "0.0.0.0", 5555),  # neither launcher nor rank: unknown
    ]
    owned = classify(listeners, exporters={9100}, launcher=10, ranks={11: 40000})
    assert [s.owner for s in owned] == ["torch", "torch", "torch", "hpcpipe", "unknown"]
    assert [s.port for s in violations(owned)] == [29400, 5555]  # torch's own count: a local run


def test_a_forked_workers_listeners_are_torchs_without_its_port() -> None:
    # A worker forked from the agent's fork server: /proc shows no MASTER_PORT for it (None).
    listeners = [Listener(21, "::", 40000), Listener(21, "127.0.0.1", 9100), Listener(22, "::", 7)]
    owned = classify(listeners, exporters={9100}, launcher=20, ranks={21: None})
    assert [(s.owner, s.role) for s in owned] == [
        ("torch", "gloo or TCPStore"),
        ("hpcpipe", "prometheus exporter"),
        ("unknown", "pid 22"),
    ]
    assert [s.port for s in violations(owned)] == [40000, 7]


def test_proc_net_addresses_decode() -> None:
    assert _decode("0100007F:1F90") == ("127.0.0.1", 8080)
    assert _decode("00000000000000000000000001000000:0016") == ("::1", 22)
    mapped, port = _decode("0000000000000000FFFF00000100007F:0050")
    assert (ipaddress.ip_address(mapped), port) == (ipaddress.ip_address("::ffff:127.0.0.1"), 80)
    assert Listener(1, mapped, 80).loopback and not Listener(1, "::", 80).loopback
