"""The c10d store: the default group's, and a TCP store that listens on one address."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from hpcpipe.compat.guard import probe, require

_PEERS = "share each rank's progress for hang reports"


def default_store() -> Any:
    """The key-value store of the default process group (rank 0 serves it under env:// init)."""
    import torch.distributed.distributed_c10d as c10d

    return require(c10d, "_get_default_store", _PEERS)()


def tcp_store_takes_listen_fd() -> bool:
    """Whether this torch's ``TCPStore`` serves on a socket its caller bound (``master_listen_fd``)."""
    import torch.distributed as dist

    return "master_listen_fd" in (dist.TCPStore.__init__.__doc__ or "")


def loopback_tcp_store(
    host: str, port: int, world_size: int | None, timeout: timedelta, multi_tenant: bool = False
) -> Any:
    """A ``TCPStore`` server that listens on ``host`` alone (a loopback address); ``port`` 0 takes
    any free port (the store's ``.port`` says which). OSError if ``host:port`` is taken.

    torch's server binds every interface whatever ``host_name`` says (measured on 2.15: ``[::]``,
    with and without libuv), and no argument names the address. Handed a socket already bound
    and listening (``master_listen_fd``) it serves there instead, and owns the descriptor from
    then on. A torch without that argument gets its usual server, on every interface."""
    import torch.distributed as dist

    use_libuv = os.environ.get("USE_LIBUV", "1") == "1"  # as torch reads it for env:// stores
    if not tcp_store_takes_listen_fd():
        logging.getLogger(__name__).warning(
            "torch %s's TCPStore takes no listening socket: its store listens on every interface",
            torch.__version__,
        )
        return dist.TCPStore(host, port, world_size, True, timeout, multi_tenant=multi_tenant)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own listener
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
        store = dist.TCPStore(
            host,
            sock.getsockname()[1],
            world_size,
            True,
            timeout,
            multi_tenant=multi_tenant,
            master_listen_fd=sock.fileno(),
            use_libuv=use_libuv,
        )
    except BaseException:
        with contextlib.suppress(OSError):
            sock.close()
        raise
    sock.detach()  # the store closes it: a second close could hit a descriptor reused meanwhile
    return store


PRIVATE_APIS: dict[str, Callable[[], Any]] = {
    "distributed_c10d._get_default_store": probe(
        "torch.distributed.distributed_c10d", "_get_default_store", purpose=_PEERS
    ),
}
"""The private names this module reaches, each with a probe (``hpcpipe.compat.PRIVATE_APIS``)."""
