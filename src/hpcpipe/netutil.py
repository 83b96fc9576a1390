"""Network helpers shared by launchers, benchmarks, chaos trials and tests."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now, chosen by the OS (loopback unless told otherwise).

    Another process may take it before it is used; callers that bind it at once rarely lose that
    race, and a rendezvous that loses it fails loudly rather than hanging.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
