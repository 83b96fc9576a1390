"""The c10d rendezvous of agents that all run on this machine, served on loopback alone.

torch's ``c10d`` rendezvous backend hosts its store with a ``TCPStore`` server, which listens on
every interface (``[::]``) whatever the endpoint says. When the endpoint is a loopback address
(``hpcpipe train --nproc N``: 127.0.0.1:0; two local "nodes" of one elastic job), every agent
that can join runs on this machine, so ``hpcpipe-loopback`` serves the same store on that address
alone (``compat.loopback_tcp_store``). The rest is torch's own c10d rendezvous, through its public
extension point: ``C10dRendezvousBackend`` on that store, the handler ``create_handler`` would
build (timings in fractions of a second; polled every ``POLL_S``), the handler registry.

Any other endpoint (Slurm's head node, a Kubernetes service) keeps torch's ``c10d`` backend: the
other nodes must reach the store there.
"""

from __future__ import annotations

import errno
from datetime import timedelta
from typing import Any

from hpcpipe.netutil import is_loopback, loopback_bind_address

LOOPBACK_BACKEND = "hpcpipe-loopback"
DEFAULT_PORT = 29400  # torch's, for an endpoint without a port
# How often a node waiting in a round of a loopback rendezvous reads the store again (torch: 1 s),
# and how long its handler serves a cached copy of the state (the agent asks it every 0.1 s
# whether a node waits to join). A waiting agent notices a lost node's expiry and the end of its
# round's last call up to this much later. A read of the state over loopback takes 0.07 ms of CPU
# (measured here): 10 a second cost an agent under 0.1% of a core.
POLL_S = 0.1
TIMEOUTS = ("join", "last_call", "close", "heartbeat")  # torch's <name>_timeout options, in seconds


def rendezvous_backend(endpoint: str) -> str:
    """The rendezvous backend for ``endpoint`` (``host:port``): ``hpcpipe-loopback`` (registered
    with torch on the way) for a loopback host, else torch's ``c10d``."""
    if not is_loopback(split_endpoint(endpoint)[0]):
        return "c10d"
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(LOOPBACK_BACKEND, _create_handler)  # again: a no-op
    return LOOPBACK_BACKEND


def node_address(endpoint: str, local_addr: str | None) -> str | None:
    """This node's address as the agent tells its peers and workers (MASTER_ADDR on the node
    that ends up rank 0): the one given, else the loopback address for a loopback endpoint (torch
    would take the machine's name, which may resolve to any interface), else torch's choice."""
    host = split_endpoint(endpoint)[0]
    return local_addr or (loopback_bind_address(host) if is_loopback(host) else None)


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or a bare host -> (host, port); ValueError for no host or a
    port outside 0-65535 (the store's bind raised an OverflowError traceback after the data
    preparation). Port 0: any free one (one host's runs)."""
    host, colon, port = endpoint.strip().rpartition(":")
    if not colon or (":" in host and not host.endswith("]")):  # a bare host, IPv6 included
        host, number = endpoint.strip(), DEFAULT_PORT
    else:
        number = int(port) if port else DEFAULT_PORT
    host = host.strip("[]")
    if not host or not 0 <= number <= 65535:
        raise ValueError(endpoint)
    return host, number


def _create_handler(params: Any) -> Any:
    """torch's c10d rendezvous handler, on a store that listens on the endpoint's address only.

    Built as torch's ``create_handler`` builds it (``DynamicRendezvousHandler.from_backend``), but
    its timings are read as seconds with fractions: torch's parser takes whole seconds, and on one
    host a heartbeat of 0.5 s is what keeps a lost local "node" from costing seconds (agent.py,
    ``LOCAL_KEEP_ALIVE_S``). A waiting node reads this store every ``POLL_S`` (torch: every 1 s;
    the agent's ``quick_rendezvous`` shortens the sleep, ``rendezvous_state_cache`` the cache).
    """
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    from hpcpipe.compat import rendezvous_state_cache

    class LoopbackBackend(C10dRendezvousBackend):
        @property
        def name(self) -> str:  # the handler reports it; torch checks it is the one registered
            return LOOPBACK_BACKEND

    timeout = RendezvousTimeout(**{name: _seconds(params, f"{name}_timeout") for name in TIMEOUTS})
    interval = _seconds(params, "keep_alive_interval")
    keep_alive: dict[str, Any] = {  # from_backend makes a timedelta of the interval, fractions too
        "keep_alive_interval": interval.total_seconds() if interval else 5,  # torch's defaults
        "keep_alive_max_attempt": int(params.get("keep_alive_max_attempt", 3)),
    }
    store = _store(params)
    handler = DynamicRendezvousHandler.from_backend(
        params.run_id,
        store,
        LoopbackBackend(store, params.run_id),
        params.min_nodes,
        params.max_nodes,
        params.local_addr,
        timeout,
        **keep_alive,
    )
    rendezvous_state_cache(handler, POLL_S)
    return handler


def _seconds(params: Any, key: str) -> timedelta | None:
    """A rendezvous option in seconds (fractions allowed); None when not given."""
    value = params.get(key)
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"the rendezvous option {key}={value!r} is not a number of seconds") from None
    if not seconds > 0:
        raise ValueError(f"the rendezvous option {key}={value!r} must be positive")
    return timedelta(seconds=seconds)


def _store(params: Any) -> Any:
    """Host the store on the endpoint's loopback address or, as torch does when the port is taken
    (another local agent of the job hosts it), connect to it. ``is_host`` in the rendezvous
    configs decides instead when given (``AgentSpec.local_addr``)."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import RendezvousConnectionError

    from hpcpipe.compat import loopback_tcp_store

    host, port = split_endpoint(params.endpoint)
    host = loopback_bind_address(host)
    timeout = timedelta(seconds=params.get_as_int("read_timeout", 60))
    is_host = params.get_as_bool("is_host")
    try:
        if is_host is not False:
            try:
                return loopback_tcp_store(host, port, None, timeout, multi_tenant=True)
            except OSError as exc:
                if is_host or port == 0 or exc.errno != errno.EADDRINUSE:
                    raise
        return dist.TCPStore(host, port, None, False, timeout)
    except (OSError, ValueError, RuntimeError) as exc:
        raise RendezvousConnectionError(
            f"the c10d store at {host}:{port} could not be hosted or reached: {exc}"
        ) from exc
