"""launch/rendezvous.py and the agent's rendezvous options (launch/agent.py ``_rdzv_configs``): the
heartbeat, the missed heartbeats that lose a node and the last call reach torch's c10d handler as
configured, fractions of a second included on one host, whole seconds between hosts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from hpcpipe import compat
from hpcpipe.launch.agent import KEEP_ALIVE_MISSES, LOCAL_KEEP_ALIVE_S, AgentSpec, _rdzv_configs
from hpcpipe.launch.rendezvous import LOOPBACK_BACKEND, POLL_S, rendezvous_backend


@pytest.fixture
def handlers() -> Iterator[list[Any]]:
    """Handlers made here: their rendezvous is closed on the way out."""
    made: list[Any] = []
    yield made
    for handler in made:
        handler.shutdown()


def torch_handler(spec: AgentSpec, made: list[Any]) -> Any:
    """The handler torch's agent gets for ``spec``: its registry, the agent's options."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

    params = RendezvousParameters(
        backend=rendezvous_backend(spec.rdzv_endpoint),
        endpoint=spec.rdzv_endpoint,
        run_id="test-rdzv",
        min_nodes=spec.min_nodes,
        max_nodes=spec.max_nodes,
        **_rdzv_configs(spec),
    )
    made.append(rendezvous_handler_registry.create_handler(params))
    return made[-1]


def test_agents_on_one_host_beat_every_half_second_and_lose_a_node_after_three_misses(
    handlers: list[Any],
) -> None:
    spec = AgentSpec(nproc_per_node=1, min_nodes=1, max_nodes=2, rdzv_endpoint="127.0.0.1:0", last_call_s=5)
    settings = torch_handler(spec, handlers).settings
    assert settings.keep_alive_interval == timedelta(seconds=LOCAL_KEEP_ALIVE_S) == timedelta(seconds=0.5)
    assert settings.keep_alive_max_attempt == KEEP_ALIVE_MISSES == 3
    assert settings.timeout.last_call == timedelta(seconds=5)


def test_fractions_of_a_second_reach_the_loopback_handler(handlers: list[Any]) -> None:
    spec = AgentSpec(
        nproc_per_node=1,
        max_nodes=2,
        rdzv_endpoint="127.0.0.1:0",
        last_call_s=0.75,
        keep_alive_s=0.25,
        keep_alive_misses=4,
    )
    assert rendezvous_backend(spec.rdzv_endpoint) == LOOPBACK_BACKEND
    handler = torch_handler(spec, handlers)
    assert handler.settings.keep_alive_interval == timedelta(seconds=0.25)
    assert handler.settings.keep_alive_max_attempt == 4
    assert handler.settings.timeout.last_call == timedelta(seconds=0.75)
    assert handler.settings.timeout.join == timedelta(seconds=600)  # torch's defaults stay
    # A waiting node reads the store every POLL_S (this torch's cache can be set: compat says so).
    assert compat.rendezvous_state_cache(handler, POLL_S)


def test_between_hosts_torch_gets_whole_seconds() -> None:
    """torch's c10d parser takes int(value): 0.5 would be 0 (an error), 1.5 would be 1."""
    spec = AgentSpec(
        nproc_per_node=1, max_nodes=2, rdzv_endpoint="head:29400", last_call_s=0.5, keep_alive_s=1.5
    )
    configs = _rdzv_configs(spec)
    assert configs["last_call_timeout"] == 1 and configs["keep_alive_interval"] == 2
    assert configs["keep_alive_max_attempt"] == 3
    default = _rdzv_configs(AgentSpec(nproc_per_node=1, rdzv_endpoint="head:29400", keep_alive_misses=5))
    assert "keep_alive_interval" not in default  # torch's 5 s
    assert default["keep_alive_max_attempt"] == 5 and default["last_call_timeout"] == 15


@pytest.mark.parametrize("bad", ["0", "-1", "soon"])
def test_a_timing_that_is_not_a_positive_number_is_refused(bad: str, handlers: list[Any]) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

    params = RendezvousParameters(
        backend=rendezvous_backend("127.0.0.1:0"),
        endpoint="127.0.0.1:0",
        run_id="test-rdzv",
        min_nodes=1,
        max_nodes=2,
        keep_alive_interval=bad,
    )
    with pytest.raises(Exception, match="keep_alive_interval"):
        handlers.append(rendezvous_handler_registry.create_handler(params))
