"""The supervisor's side of the run's template (launch/template.py): start it, ask it for children, and hold
each forked child as the part of a Popen the supervisor uses.

A child is forked only when a fresh `python -m slimecli.X` would start the same: the same interpreter, and the
same environment variables read while the interpreter and its libraries start (PYTHON*, malloc's, OpenMP's, the
loader's, torch's and Hugging Face's). Anything else, a GPU build of torch (CUDA must not be touched before a
fork), or a template that failed, starts with Popen as before; so does every child with SLIMECLI_TEMPLATE=0.

`slimecli train`, `slimecli eval` and `slimecli teacher serve` start the template before anything else
(start_early), and the run's supervisor takes that one.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from slimecli.launch import pdeathsig
from slimecli.launch.child_env import child_env
from slimecli.observe import startup

MODULE = "slimecli.launch.template"
# read once, when the interpreter or a library starts (OpenMP's wait policy among them: a spinning pool on shared
# cores slows the other side 5-8x, launch/plan.py); OMP_NUM_THREADS is set by the child itself
START_VARS = ("PYTHON", "MALLOC_", "LD_", "GLIBC_TUNABLES", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH_",
              "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "CUDA_", "LC_", "LANG")
READY_TIMEOUT_S = 300.0  # the imports, on a loaded machine
FORK_TIMEOUT_S = 30.0
PR_SET_CHILD_SUBREAPER = 36


def forkable(argv: list[str]) -> bool:
    return (len(argv) >= 3 and argv[1] == "-m" and argv[2].startswith("slimecli.") and argv[2] != MODULE
            and os.path.realpath(argv[0]) == os.path.realpath(sys.executable))


def start_vars(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(START_VARS) and k != "OMP_NUM_THREADS"}


def _subreaper(on: bool) -> bool:
    """Orphans of our descendants become our children (while on): how a template's child is adopted."""
    return pdeathsig.prctl(PR_SET_CHILD_SUBREAPER, int(on))


class ForkedProcess:
    """A child the template forked and this process adopted: pid, args, stdout, returncode, poll, wait and the
    signals, as on a Popen."""

    def __init__(self, pid: int, args: list[str], stdout: IO[bytes]) -> None:
        self.pid, self.args, self.stdout = pid, args, stdout
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: its code is lost
                    self.returncode = -9
                    return self.returncode
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)


def fork_from_here(argv: list[str], out: IO[bytes]) -> ForkedProcess | None:
    """`python -m slimecli.X` forked from this process once it has imported the serving modules (template.py:
    fork_here), its output to `out`: a command that imports torch itself and starts one server (`slimecli agent
    run`); None where it cannot be forked (start it with Popen)."""
    from slimecli.launch.template import fork_here

    pid = fork_here(argv, dict(os.environ), os.getcwd(), out.fileno())
    return None if pid is None else ForkedProcess(pid, argv, out)


class Template:
    """The template process of one supervisor, and the requests to it (one at a time)."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, env: dict[str, str]) -> None:
        self.proc, self.sock, self.env = proc, sock, env
        self.ready: bool | None = None  # None until the template has said
        self.why = ""  # why it cannot serve
        self._lock = threading.Lock()
        assert proc.stdout is not None
        self.log = _LateLog(proc.stdout)

    @classmethod
    def start(cls, env: dict[str, str], log_path: Path | None, serving: bool = False) -> Template | None:
        """The template, importing in the background; None where children cannot be forked here. One started
        early (start_early) with the same start variables is taken instead. ``log_path``: where its output goes
        (None: kept until its log's `to` names one). ``serving``: its children are engines and evaluators only, and
        it imports what they need (launch/template.py: SERVING_PRELOAD)."""
        from slimecli.launch.template import can_fork

        early = _take_early(env)
        if early is not None:
            if log_path is not None:
                early.log.to(log_path)
            return early
        if not can_fork(env):
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            argv = [sys.executable, "-m", MODULE, str(theirs.fileno()), str(os.getpid()), *(["serving"] if serving else [])]
            proc = subprocess.Popen(pdeathsig.command(argv), env={**env, "OMP_NUM_THREADS": "1"},
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True, pass_fds=(theirs.fileno(),))
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        template = cls(proc, ours, env)
        if log_path is not None:
            template.log.to(log_path)
        return template

    def fork(self, argv: list[str], env: dict[str, str], cwd: str | None) -> ForkedProcess | None:
        """`argv` forked from the template, adopted by this process; None: start it some other way."""
        if not forkable(argv) or start_vars(env) != start_vars(self.env):
            return None
        with self._lock:
            if not self._await_ready(env):
                return None
            read, write = os.pipe()
            adopted = _subreaper(True)
            try:
                if not adopted:
                    raise OSError("this process cannot adopt the template's children (prctl)")
                socket.send_fds(self.sock, [json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()], [write])
                answer = self._receive(FORK_TIMEOUT_S)
            except OSError as exc:
                answer = {"error": str(exc)}
            finally:
                if adopted:
                    _subreaper(False)
                os.close(write)
            if "pid" not in answer:
                os.close(read)
                self.ready, self.why = False, str(answer.get("error", "no answer"))
                return None
            return ForkedProcess(int(answer["pid"]), list(argv), os.fdopen(read, "rb"))

    def _await_ready(self, env: dict[str, str]) -> bool:
        """Its answer, once; its imports' line goes where the first child's run profiles its start-up."""
        if self.ready is None:
            answer = self._receive(READY_TIMEOUT_S)
            self.ready, self.why = bool(answer.get("ready")), str(answer.get("why") or answer.get("error", ""))
            path = startup.run_file(env)
            if self.ready and answer.get("imported") and path is not None:
                startup.write(answer["imported"], path)
        return self.ready

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(1 << 16)
        except OSError as exc:
            return {"error": f"the template did not answer: {exc}"}
        if not data:
            return {"error": f"the template exited (code {self.proc.poll()})"}
        answer: dict[str, Any] = json.loads(data)
        return answer

    def stop(self) -> None:
        """Tell the template to end, without waiting (its children are the supervisor's and are not touched)."""
        from slimecli.process import signal_group

        self.sock.close()
        signal_group(self.proc.pid, signal.SIGTERM)

    def close(self, grace_s: float = 5.0) -> None:
        """End the template and wait for it."""
        from slimecli.process import kill_group

        self.stop()
        kill_group(self.proc.pid, grace_s=grace_s, leader=self.proc)
        self.proc.wait()
        self.log.close()


class _LateLog:
    """The template's output, pumped from its pipe: kept in memory until `to` names the log file (a template
    started before its run directory exists), appended to that file from then on."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.kept: list[bytes] = []
        self.file: IO[bytes] | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, daemon=True, name="log-template")
        self._thread.start()

    def to(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self.file = open(path, "ab", buffering=0)  # closed by close(), after the pump has ended
            self.file.write(b"".join(self.kept))
            self.kept.clear()

    def _pump(self) -> None:
        fd = self.stream.fileno()
        try:
            for chunk in iter(lambda: os.read(fd, 1 << 16), b""):
                with self._lock:
                    if self.file is None:
                        self.kept.append(chunk)
                    else:
                        self.file.write(chunk)
        except (OSError, ValueError):  # closed under it (close() gave up waiting)
            pass

    def close(self) -> None:
        self._thread.join(timeout=2)
        with self._lock:
            if self.file is not None:
                self.file.close()
            self.stream.close()


# A template started by start_early, before the command composed its config: Template.start takes it.
_early: list[Template] = []


def start_early(serving: bool = False) -> None:
    """The template of the run this command will launch, started before anything else (cli/entry.py: `slimecli
    train`, `eval` and `teacher serve`). Its imports, 3 CPU-seconds on one core, then overlap the command line's
    own start and the composing and checking of the config on the other, instead of following them: about 0.2 s
    sooner to every child. The environment is what every child gets (launch/child_env.py); a run whose
    children need other start variables (an overlapped run's OpenMP wait policy) ends it and starts its own. A
    command that stops before it launches anything (a config error) ends it as it exits. ``serving``: the command
    runs engines and evaluators only (`slimecli eval`)."""
    template = Template.start({**os.environ, **child_env()}, None, serving)
    if template is not None:
        _early.append(template)
        atexit.register(drop_early, wait=False)


def _take_early(env: dict[str, str]) -> Template | None:
    while _early:
        template = _early.pop()
        if template.proc.poll() is None and start_vars(template.env) == start_vars(env):
            return template
        template.close()
    return None


def drop_early(wait: bool = True) -> None:
    """End an early template no run took (at this process's exit: without waiting, its signal is enough)."""
    while _early:
        template = _early.pop()
        if wait:
            template.close()
        else:
            template.stop()

