"""The host half of a sandbox's network: one unix socket per allowed loopback port, forwarded to that port.

A bwrap sandbox has its own network namespace (only `lo`). Inside, the launcher (inner.py) listens on
127.0.0.1:<port> and forwards each connection to <dir>/<port>.sock, which this relay accepts on the host
and connects to 127.0.0.1:<port>. The directory is bound read-only; nothing else on the host is reachable.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

from slimecli.sandbox.inner import Relay


def _tcp(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


class HostRelay:
    """Accepts on `<directory>/<port>.sock` for each port, in one thread, until close()."""

    def __init__(self, directory: Path, ports: Sequence[int]) -> None:
        self.directory = directory
        self.paths = {port: str(directory / f"{port}.sock") for port in ports}
        servers = []
        for port, path in self.paths.items():
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(path)
            os.chmod(path, 0o666)  # the sandbox uid connects; the directory is reachable by this sandbox only
            server.listen(64)
            servers.append((server, port))
        self._stop_r, self._stop_w = os.pipe()
        relay = Relay(servers, _tcp, stop_fd=self._stop_r)
        self._thread = threading.Thread(target=relay.run, daemon=True, name="sandbox-relay")
        self._thread.start()

    def targets(self) -> list[tuple[int, str]]:
        return list(self.paths.items())

    def close(self) -> None:
        if self._stop_w < 0:
            return
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=10)
        for fd in (self._stop_r, self._stop_w):
            os.close(fd)
        self._stop_w = -1
        for path in self.paths.values():
            Path(path).unlink(missing_ok=True)
