"""Network helpers shared by launchers, benchmarks, chaos trials and tests."""

from __future__ import annotations

import ipaddress
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now, chosen by the OS (loopback unless told otherwise).

    Another process may take it before it is used; callers that bind it at once rarely lose that
    race, and a rendezvous that loses it fails loudly rather than hanging.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) names this machine's loopback: a store
    there can be reached from this machine alone, so every peer that meets there runs here."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def loopback_bind_address(host: str) -> str:
    """The address to listen on for peers that connect to ``host`` on this machine: ``host``
    itself when it is a loopback address, else 127.0.0.1."""
    host = host.strip("[]")
    return host if host.lower() != "localhost" and is_loopback(host) else "127.0.0.1"


def loopback_interface() -> str | None:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS), None if neither exists."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return None
    return next((name for name in ("lo", "lo0") if name in names), None)
