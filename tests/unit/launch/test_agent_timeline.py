"""The agent's side of a restart: torch's metric stream turned into ``agent_restart`` events
(launch/agent_timeline.py), the cheaper rendezvous (compat.quick_rendezvous) and what the fork
server imports for a job's workers (launch/job.py worker_preload)."""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.metrics.api import MetricData

from hpcpipe import compat
from hpcpipe.config import load_config
from hpcpipe.launch.agent_timeline import RestartTimeline, recording_restarts
from hpcpipe.launch.job import worker_preload
from hpcpipe.observe.metrics import read_events
from hpcpipe.recipes.registry import recipe_class, registry

pytestmark = pytest.mark.timeout(60)

T = 1_800_000_000.0


def _metric(name: str, at: float, value: int = 1) -> MetricData:
    return MetricData(at, "torchelastic", name, value)


def test_the_agents_metrics_become_one_restart_event(tmp_path: Path) -> None:
    seen: list[str] = []

    class Previous:
        def emit(self, data: MetricData) -> None:
            seen.append(data.name)

    timeline = RestartTimeline(tmp_path, Previous(), "n1")
    stream = [
        _metric("SimpleElasticAgent._rendezvous.duration.ms", T - 9.0, 5),  # the first start
        _metric("LocalElasticAgent._monitor_workers.duration.ms", T + 0.4, 300),  # began at T + 0.1
        _metric("workers.default.failed", T + 0.41),
        _metric("LocalElasticAgent._stop_workers.duration.ms", T + 0.5, 2),
        _metric("SimpleElasticAgent._rendezvous.duration.ms", T + 0.6, 100),
        _metric("LocalElasticAgent._start_workers.duration.ms", T + 0.7, 100),
        _metric("SimpleElasticAgent._restart_workers.duration.ms", T + 0.71, 300),
    ]
    for data in stream:
        timeline.emit(data)
    assert seen == [d.name for d in stream]  # every metric passed on
    (event,) = [e for e in read_events(tmp_path) if e["event"] == "agent_restart"]
    assert event["failure_seen"] == pytest.approx(T + 0.1)
    assert (event["workers_stopped"], event["rendezvous_done"], event["workers_started"]) == (
        T + 0.5,
        T + 0.6,
        T + 0.7,
    )
    assert (event["node"], event["restart"]) == ("n1", 1)
    timeline.emit(_metric("SimpleElasticAgent._restart_workers.duration.ms", T + 9.0))  # membership
    assert [e.get("failure_seen") for e in read_events(tmp_path) if e["event"] == "agent_restart"][1] is None


def test_recording_restarts_restores_the_previous_handler(tmp_path: Path) -> None:
    from torch.distributed.elastic import metrics

    before = metrics.getStream("torchelastic").handler
    with recording_restarts(str(tmp_path)) as timeline:
        assert metrics.getStream("torchelastic").handler is timeline
    assert metrics.getStream("torchelastic").handler is before
    with recording_restarts(None) as nothing:
        assert nothing is None
    missing = RestartTimeline(tmp_path / "gone", None, "n1")
    missing.emit(_metric("SimpleElasticAgent._restart_workers.duration.ms", T))  # no run dir: no error


def test_quick_rendezvous_names_steps_as_torch_does_and_drops_only_random_waits() -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    def step() -> str:  # a method calling _record, which calls get_method_name
        def _record() -> str:
            return rdzv.get_method_name()

        return _record()

    torch_name, torch_delay = step(), rdzv._delay
    with compat.quick_rendezvous(one_node=True):
        assert step() == torch_name == "step"
        started = time.perf_counter()
        rdzv._delay(seconds=(0.5, 0.6))  # the join jitter and CAS back-off: skipped
        assert time.perf_counter() - started < 0.2
        started = time.perf_counter()
        rdzv._delay(seconds=0.05)  # a fixed wait (polling a round): kept
        assert time.perf_counter() - started >= 0.04
    assert rdzv._delay is torch_delay and step() == "step"
    with compat.quick_rendezvous(one_node=False):
        assert rdzv._delay is torch_delay  # several nodes: the jitter spreads their joins


def test_every_recipe_names_worker_modules_that_import() -> None:
    names = list(registry().recipes)
    assert {"gpt", "resnet-cifar", "lora-function-calling"} <= set(names)
    for name in names:
        for module in recipe_class(name).worker_imports:
            importlib.import_module(module)  # the fork server would skip a typo silently
    preload = worker_preload(load_config("tiny"))
    assert preload[0] == "hpcpipe.train.trainer" and "hpcpipe.recipes.gpt" in preload


def test_deepspeed_is_preloaded_for_cpu_ranks_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed compiles at import: the fork server imports it for a DeepSpeed job's CPU ranks, never
    where a GPU device node exists (its CUDA accelerator would initialise CUDA before the fork)."""
    from hpcpipe.train import environment

    module = "hpcpipe.train.deepspeed_cpu_import"
    job = load_config("tiny", ["parallel.strategy=deepspeed"])
    monkeypatch.setattr(environment, "GPU_DEVICE_NODES", (str(tmp_path / "nvidiactl"),))
    assert module in worker_preload(job)
    assert module not in worker_preload(load_config("tiny"))  # DDP ranks never import DeepSpeed
    (tmp_path / "nvidiactl").touch()
    assert module not in worker_preload(job)
