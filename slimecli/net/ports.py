"""A free TCP port to hand to a server or a process group that must be told its port before it starts."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS picks it); the caller binds it soon after."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
