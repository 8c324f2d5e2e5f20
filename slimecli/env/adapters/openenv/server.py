"""The OpenEnv server process: `python -m uvicorn <app> --host 127.0.0.1 --port <free>` in its own process group,
ready once /health answers, ended with the group (uvicorn's workers too).

OpenEnv's UVProvider does not fit: it needs a uv project checkout (`uv run --isolated`), binds 0.0.0.0 and stops
only its child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any

from slimecli.env.provider import EnvLoadError
from slimecli.net.ports import free_port
from slimecli.process import kill_group

GRACE_S = 5.0  # SIGTERM to SIGKILL when the provider closes
EXIT_GRACE_S = 1.0  # the same when the interpreter exits with the server still up
PORT_TRIES = 3  # a port picked free can be taken before uvicorn binds it
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def get_json(url: str, timeout: float) -> dict[str, Any]:
    """GET an OpenEnv endpoint's JSON object ({} for another JSON value); EnvLoadError when it does not answer."""
    try:
        with _direct.open(url, timeout=timeout) as response:
            body = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise EnvLoadError(f"env=openenv: {url} did not answer as an OpenEnv server: {e}") from e
    return body if isinstance(body, dict) else {}


class Server:
    """One started app; its log (stdout and stderr) is a temporary file, quoted when it fails to start."""

    def __init__(self, app: str, env_vars: dict[str, str], workers: int) -> None:
        self.app, self.env_vars, self.workers = app, env_vars, workers
        self.proc: subprocess.Popen[bytes] | None = None
        fd, log = tempfile.mkstemp(prefix="slimecli-openenv-", suffix=".log")
        os.close(fd)
        self.log = Path(log)
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def start(self, timeout_s: float) -> str:
        """The server's base URL once /health answers 200; EnvLoadError (with the log's tail) otherwise."""
        env = {**os.environ, **self.env_vars}
        # the child imports what this process can (sys.path entries a test or a notebook added included)
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
            [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + [p for p in sys.path if p]))
        for attempt in range(PORT_TRIES):
            port = free_port()
            command = [sys.executable, "-m", "uvicorn", self.app, "--host", "127.0.0.1", "--port", str(port),
                       "--log-level", "warning"] + (["--workers", str(self.workers)] if self.workers > 1 else [])
            with self.log.open("wb") as log:
                self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
            if self._finalizer is not None:
                self._finalizer.detach()
            self._finalizer = weakref.finalize(self, kill_group, self.proc.pid, EXIT_GRACE_S, self.proc)
            base_url = f"http://127.0.0.1:{port}"
            if self._healthy(base_url, timeout_s):
                return base_url
            code, tail = self.proc.poll(), self.tail()
            if code is not None and "address already in use" in tail.lower() and attempt < PORT_TRIES - 1:
                continue
            self.stop()
            why = f"did not answer /health within {timeout_s:g} s" if code is None else f"exited with code {code}"
            raise EnvLoadError(f"env=openenv: the server of {self.app} {why}:\n{tail}")
        raise AssertionError("unreachable")

    def _healthy(self, base_url: str, timeout_s: float) -> bool:
        """/health answered 200 within timeout_s (False at once when the process exits)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with _direct.open(f"{base_url}/health", timeout=1.0) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        return False

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc.pid, GRACE_S, leader=self.proc)
        if self._finalizer is not None:
            self._finalizer.detach()
        self.log.unlink(missing_ok=True)
