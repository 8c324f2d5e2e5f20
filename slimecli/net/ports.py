"""A free TCP port to hand to a server or a process group that must be told its port before it starts."""

from __future__ import annotations

import socket

MAX_PORT = 65535
BLOCK_TRIES = 64  # a block of consecutive free ports is found within a few tries on any but a packed machine


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS picks it); the caller binds it soon after."""
    with socket.socket(_family(host)) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(host: str, count: int) -> int:
    """The first of ``count`` consecutive ports nothing listens on now (servers numbered from one base port,
    as engine k on rollout.port + k); OSError when no such block turns up."""
    if count <= 1:
        return free_port(host)
    for _ in range(BLOCK_TRIES):
        base = free_port(host)
        if base + count - 1 <= MAX_PORT and all(_bindable(host, port) for port in range(base, base + count)):
            return base
    raise OSError(f"no {count} consecutive free ports on {host} after {BLOCK_TRIES} tries")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(_family(host)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind (aiohttp)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
