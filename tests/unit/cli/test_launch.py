"""`hpcpipe launch agent` (cli/launch.py): the job's rendezvous keys reach the node agent, and from
there torch's rendezvous handler, the shipped lost-node scenario's among them. Where a
`launch slurm --grid` sweep goes."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import typer

from hpcpipe.chaos.scenario import load_scenarios
from hpcpipe.cli import launch
from hpcpipe.cli.chaos import scenario_file
from hpcpipe.config import load_config
from hpcpipe.launch.agent import AgentSpec, _rdzv_configs
from hpcpipe.launch.rendezvous import rendezvous_backend


def agent_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sets: list[str]) -> AgentSpec:
    """The spec `hpcpipe launch agent CONFIG --nnodes 1:2` gives the node agent for a tiny job with
    ``sets`` (nothing is started)."""
    import hpcpipe.launch.agent as agent_module
    import hpcpipe.launch.job as job_module

    job = load_config("tiny", [f"run.out_dir={tmp_path}", *sets])
    config = tmp_path / "config.yaml"
    config.write_text(job.to_yaml())
    specs: list[AgentSpec] = []
    monkeypatch.setattr(launch, "_run_node_agent", lambda _job, _config, spec: specs.append(spec) or 0)
    monkeypatch.setattr(job_module, "prestart_node_fork_server", lambda _job: None)
    monkeypatch.setattr(agent_module, "stop_early_on_preemption", lambda _code: None)
    with pytest.raises(typer.Exit) as done:
        launch.agent(config, nnodes="1:2", rdzv_endpoint="127.0.0.1:0", rdzv_id="test")
    assert done.value.exit_code == 0
    (spec,) = specs
    return spec


def handler_settings(spec: AgentSpec) -> Any:
    """What torch's handler for ``spec`` uses (made as torch's agent makes it; closed again)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

    params = RendezvousParameters(
        backend=rendezvous_backend(spec.rdzv_endpoint),
        endpoint=spec.rdzv_endpoint,
        run_id=spec.rdzv_id,
        min_nodes=spec.min_nodes,
        max_nodes=spec.max_nodes,
        **_rdzv_configs(spec),
    )
    handler = rendezvous_handler_registry.create_handler(params)
    try:
        return handler.settings
    finally:
        handler.shutdown()


def test_the_job_s_rendezvous_keys_reach_torch_s_handler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sets = [
        "parallel.rdzv_last_call_s=0.75",
        "parallel.rdzv_keep_alive_s=0.25",
        "parallel.rdzv_keep_alive_misses=4",
    ]
    spec = agent_spec(tmp_path, monkeypatch, sets)
    assert (spec.min_nodes, spec.max_nodes) == (1, 2)
    assert (spec.last_call_s, spec.keep_alive_s, spec.keep_alive_misses) == (0.75, 0.25, 4)
    settings = handler_settings(spec)
    assert settings.keep_alive_interval == timedelta(seconds=0.25)
    assert settings.keep_alive_max_attempt == 4
    assert settings.timeout.last_call == timedelta(seconds=0.75)


def test_the_lost_node_scenario_s_agents_lose_a_node_after_1_5_s_of_silence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settings the shipped lost-node scenario's agents run with (its time to recover is
    measured in benchmarks/, not here): 0.5 s heartbeats, 3 misses, a 0.5 s last call."""
    (scenario,) = [s for s in load_scenarios(scenario_file("shipped")) if s.name == "lost-node"]
    settings = handler_settings(agent_spec(tmp_path, monkeypatch, list(scenario.sets)))
    silence = settings.keep_alive_interval * settings.keep_alive_max_attempt
    assert (settings.keep_alive_interval, silence) == (timedelta(seconds=0.5), timedelta(seconds=1.5))
    assert settings.timeout.last_call == timedelta(seconds=0.5)


def test_an_elastic_node_range_under_deepspeed_is_refused(tmp_path: Path) -> None:
    """parallel.nnodes refuses 1:2 under DeepSpeed (its checkpoints cannot resume after a shrink);
    --nnodes 1:2 went past that check."""
    from hpcpipe.errors import UserError

    config = tmp_path / "config.yaml"
    config.write_text(load_config("tiny", ["parallel.strategy=deepspeed"]).to_yaml())
    with pytest.raises(UserError, match=r"--nnodes 1:2: .*DeepSpeed ZeRO checkpoints"):
        launch.agent(config, nnodes="1:2", rdzv_endpoint="127.0.0.1:0", rdzv_id="test")


def test_a_slurm_grid_goes_under_the_job_s_out_dir_unless_out_is_given(tmp_path: Path) -> None:
    """run.out_dir was ignored: the array's sweep went to ./runs/sweep-<name>."""
    sets = [f"run.out_dir={tmp_path / 'scratch'}"]
    sub, points = launch._submission("tiny", sets, ["train.lr=[0.1,0.2]"], None)
    assert sub.sweep_dir == sub.script_dir == tmp_path / "scratch" / "sweep-tiny"
    assert {p.run_dir.parent for p in points} == {sub.sweep_dir}
    given, _ = launch._submission("tiny", sets, ["train.lr=[0.1,0.2]"], tmp_path / "given")
    assert given.sweep_dir == tmp_path / "given"


def _finished_run(tmp_path: Path) -> Path:
    """A tiny run that trained to its last step (6); returns its config.yaml."""
    import json

    from hpcpipe.layout import RunLayout

    job = load_config("tiny", [f"run.out_dir={tmp_path}", "train.steps=6"])
    layout = RunLayout(job.run_dir)
    (layout.checkpoints / "step-00000006").mkdir(parents=True)
    layout.config.write_text(job.to_yaml())
    layout.events.write_text(json.dumps({"event": "run_finished", "step": 6}) + "\n")
    return layout.config


def test_every_node_s_agent_refuses_new_training_settings_for_a_finished_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent Slurm and Kubeflow start never went through run_job: resubmitted with another lr,
    the run trained nothing, exited 0 and recorded the new lr."""
    import hpcpipe.launch.agent as agent_module
    import hpcpipe.launch.job as job_module
    from hpcpipe.errors import UserError

    recorded = _finished_run(tmp_path)
    before = recorded.read_text()
    submitted = tmp_path / "submitted.yaml"
    submitted.write_text(load_config(recorded, ["train.lr=0.5"]).to_yaml())
    monkeypatch.setattr(launch, "_run_node_agent", lambda *_: pytest.fail("the workers started"))
    up: list[str] = []
    monkeypatch.setattr(agent_module, "stop_early_on_preemption", lambda _code: up.append("signals"))
    monkeypatch.setattr(job_module, "prestart_node_fork_server", lambda _job: up.append("fork server"))
    with pytest.raises(UserError, match=r"already trained to step 6 with other settings \(train\.lr"):
        launch.agent(submitted, nnodes="1", rdzv_endpoint="127.0.0.1:0", rdzv_id="test")
    assert recorded.read_text() == before
    # Judged once a preemption is a clean 75 and the fork server is forked: a job counted in
    # epochs prepares its data here (a SIGTERM then killed the agent with 143).
    assert up == ["signals", "fork server"]


def test_launch_slurm_refuses_a_finished_run_before_it_queues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcpipe.errors import UserError
    from hpcpipe.launch import slurm as slurm_launch

    recorded = _finished_run(tmp_path)
    monkeypatch.setattr(slurm_launch, "require_sbatch", lambda: "sbatch")
    monkeypatch.setattr(slurm_launch, "submit", lambda _script: pytest.fail("submitted"))
    with pytest.raises(UserError, match=r"already trained to step 6 .*\(train\.lr"):
        launch.slurm(str(recorded), sets=["train.lr=0.5"])
    assert sorted(p.name for p in recorded.parent.iterdir()) == ["checkpoints", "config.yaml", "events.jsonl"]


def test_a_preemption_before_the_agent_s_workers_start_exits_75(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The early handler raises AgentPreempted in the fork server's start or the finished-run
    check (its data preparation): only the workers' run caught it, so it was a traceback, exit 1."""
    import typer

    import hpcpipe.launch.agent as agent_module
    import hpcpipe.launch.job as job_module

    def signalled(_job: object) -> None:  # what stop_early_on_preemption's handler raises
        raise agent_module.AgentPreempted(75)

    job = tmp_path / "job.yaml"
    job.write_text(load_config("tiny", [f"run.out_dir={tmp_path}"]).to_yaml())
    monkeypatch.setattr(agent_module, "stop_early_on_preemption", lambda _code: None)
    monkeypatch.setattr(job_module, "prestart_node_fork_server", signalled)
    monkeypatch.setattr(launch, "_run_node_agent", lambda *_: pytest.fail("the workers started"))
    with pytest.raises(typer.Exit) as exited:
        launch.agent(job, nnodes="1", rdzv_endpoint="127.0.0.1:0", rdzv_id="test")
    assert exited.value.exit_code == 75
