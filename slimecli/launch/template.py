"""The run's template process: `python -m slimecli.launch.template FD CONTROLLER_PID`.

Each Python process of a run (engine, trainer, teacher, evaluator) spent its first 3 CPU-seconds importing torch
and transformers. The supervisor starts this process once (launch/forked.py); it imports them, then forks every
`python -m slimecli.X` child the supervisor asks for, which starts with those modules loaded. The fork is
double: the child's first parent exits at once, and the controller (a child subreaper while it asks) adopts
the child, so it waits for it, signals its process group and reads its exit code as for a child it started
itself. The child then does what pdeathsig.py and `python -m MODULE` do: a session of its own, the
parent-death signal, stdin from /dev/null, stdout and stderr to the pipe the supervisor sent, the spec's
working directory, environment and argv, and `ps` shows that command line (setproctitle).

Requests come on FD (a SOCK_SEQPACKET socket): {"argv", "env", "cwd"} with the pipe's write end attached;
answers are {"ready": bool, "why", "imported": its startup.jsonl line} once, then {"pid"} per request. torch
is imported with OMP_NUM_THREADS=1 (an OpenMP pool does not survive a fork); each child sets the thread count its
environment asks for.
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback
from collections.abc import Mapping
from typing import Any, NoReturn

from slimecli.launch.pdeathsig import set_parent_death_signal
from slimecli.observe import startup
from slimecli.quick_exit import exit_code, exit_now

# What the run's children import before their work (their own imports are inside their main()).
PRELOAD = ("torch", "transformers.modeling_utils", "transformers.models.auto.modeling_auto",
           "transformers.models.auto.tokenization_auto", "aiohttp", "slimecli.engine.server",
           "slimecli.engine.runner", "slimecli.train.loop", "slimecli.rollout.client", "slimecli.model.loading",
           "slimecli.eval.runner")  # not the modules run with -m (runpy warns when one is already imported)
# What serving children (engines, evaluators) import: not transformers' model code, which the engine does without
# for the architectures it implements itself (model/plain_decoder.py; 1.4 CPU-seconds)
SERVING_PRELOAD = ("torch", "transformers.models.auto.tokenization_auto", "transformers.cache_utils", "aiohttp",
                   "slimecli.engine.server", "slimecli.engine.runner", "slimecli.model.plain_decoder",
                   "slimecli.rollout.client", "slimecli.model.loading", "slimecli.eval.runner")
SERVING = frozenset({"slimecli.engine", "slimecli.eval"})  # the modules SERVING_PRELOAD is enough for
TEMPLATE_ENV = "SLIMECLI_TEMPLATE"  # "0": each child is its own `python -m` (the default forks them from a template)
LAUNCHERS = ("slimecli.launch.ranks",)  # fork children of their own: their ranks set their threads
MAX_REQUEST = 1 << 20


def preload(names: tuple[str, ...] = PRELOAD) -> str:
    """Import `names`; why this process cannot serve as a template, or "" when it can (one thread: a fork copies
    only the calling thread, and a lock another thread holds would stay held in the child)."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the children will import it themselves and say what is wrong
            return f"importing {name} failed: {exc}"
    threads = len(os.listdir("/proc/self/task"))
    return "" if threads == 1 else f"{threads} threads after the imports"


def freeze_imports() -> None:
    """Move every object the imports made out of the garbage collector's sight, before forking children.

    The children never free them; without this each collection of the oldest generation walks them again (and
    writes their headers, copying the pages a fork shares), and each child's exit scans them for open files
    (quick_exit.py): 0.12 s of an engine's or an evaluator's exit went there. No collection first: after the
    imports it takes 0.18 s and finds a few dozen objects."""
    gc.freeze()


def default_threads() -> int:
    """The intra-op threads a fresh torch process takes without OMP_NUM_THREADS: the CPUs it may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def main(argv: list[str]) -> int:
    fd, controller = int(argv[0]), int(argv[1])
    names = SERVING_PRELOAD if argv[2:] == ["serving"] else PRELOAD
    if set_parent_death_signal(signal.SIGTERM) and os.getppid() != controller:
        return 128 + signal.SIGTERM  # the controller is already gone
    threads = default_threads()  # before torch: OMP_NUM_THREADS=1 here says nothing about the machine
    sock = socket.socket(fileno=fd)
    why = preload(names)
    # the controller records the imports' end where the run profiles its start-up (this process may have started
    # before the run directory was known: launch/forked.py, start_early)
    imported = startup.row("template", "imported")
    sock.send(json.dumps({"ready": not why, "why": why, "imported": imported}).encode())
    if why:
        return 0
    freeze_imports()
    _title_ready()
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)  # as every worker
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 1)
        except OSError:
            return 0
        if not data:
            return 0  # the controller closed its end: the run is over
        try:
            request = json.loads(data)
            pid = spawn(request, fds[0], sock, controller, threads)
            answer: dict[str, Any] = {"pid": pid}
        except (ValueError, KeyError, IndexError, OSError) as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        for extra in fds:
            try:
                os.close(extra)
            except OSError:
                pass
        sock.send(json.dumps(answer).encode())


def spawn(request: dict[str, Any], out: int, sock: socket.socket, controller: int, threads: int) -> int:
    """Fork the requested child (returns its pid here, once the child has its own session; never returns in the
    child)."""
    argv, env, cwd = list(request["argv"]), dict(request["env"]), request.get("cwd")
    if len(argv) < 3 or argv[1] != "-m":
        raise ValueError(f"not a `python -m MODULE` command: {argv[:3]}")
    read, write = os.pipe()  # the intermediate parent says the child's pid
    settled, says_settled = os.pipe()  # the child says it leads its own session (its group can be signalled)
    sys.stdout.flush()
    sys.stderr.flush()
    first = os.fork()
    if first == 0:  # the intermediate parent: forks the child, says its pid, exits so the controller adopts it
        os.close(read)
        os.close(settled)
        me = os.getpid()  # not the child's getppid(): once this process has exited, that is the controller
        try:
            child = os.fork()
        except OSError:
            os._exit(1)  # the template reads no pid: the request fails
        if child == 0:
            os.close(write)
            become(argv, env, cwd, out, sock, controller, me, threads, says_settled)
        try:
            os.write(write, str(child).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.close(says_settled)
    try:
        data = os.read(read, 32)
        ok = os.read(settled, 1)  # empty: the child ended before it settled (its log says why)
    finally:
        os.close(read)
        os.close(settled)
        os.waitpid(first, 0)
    if not ok:
        raise OSError(f"the forked child {data.decode() or '?'} ended before it started")
    return int(data)


def become(argv: list[str], env: dict[str, str], cwd: str | None, out: int, sock: socket.socket, controller: int,
           first: int, threads: int, settled: int) -> NoReturn:
    """In the forked child: become `argv` as the supervisor would have started it. It never returns to the
    template's loop: a failure before the module runs ends the process, the module's own exit ends it too."""
    try:
        _adopted(controller, first)
        sock.close()
        _settle(argv, env, cwd, out, threads)
        os.write(settled, b"1")
        os.close(settled)
    except BaseException:  # noqa: BLE001 - said on the child's stderr (its log), then the child ends
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    run_module(argv)


def fork_here(argv: list[str], env: dict[str, str], cwd: str | None, out: int,
              imports: tuple[str, ...] = SERVING_PRELOAD) -> int | None:
    """Fork `python -m MODULE ARGS` from this process, once it has imported what the child needs (`imports`): one
    import of torch for a command and the server it starts (`slimecli agent run`: its tokenizer needs torch too).
    The child's pid, a child of this process; None where this process cannot fork it (other threads, a GPU build;
    start it with Popen). The child is set up as the template's children are, and drops this process's other
    files and atexit functions."""
    if not can_fork(os.environ) or _in_event_loop():
        return None
    threads = default_threads()
    if "torch" not in sys.modules:  # imported with one OpenMP thread, as in the template: its pool would not fork
        asked = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            why = preload(imports)
        finally:
            if asked is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = asked
    else:
        why = preload(imports)
    if why:
        return None
    parent = os.getpid()
    _title_ready()
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # the child's objects out of its collector's sight (freeze_imports)
    pid = os.fork()
    if pid:
        gc.unfreeze()
        _until_own_session(pid)
        return pid
    try:
        os.setsid()
        if not set_parent_death_signal(signal.SIGTERM) or os.getppid() != parent:
            os._exit(128 + signal.SIGTERM)
        import atexit

        atexit._clear()  # this process's exit functions are its parent's
        os.closerange(3, out)
        os.closerange(out + 1, 1 << 16)
        _settle(argv, env, cwd, out, threads)
    except BaseException:  # noqa: BLE001 - said on the child's stderr (its log), then the child ends
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    run_module(argv)


def _until_own_session(pid: int, timeout_s: float = 5.0) -> None:
    """Wait until the forked child leads its own session, as a template's child does before its pid is given: its
    process group can then be signalled at once (or it has already ended)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if os.getsid(pid) == pid:
                return
        except ProcessLookupError:
            return
        time.sleep(0.0005)


def _in_event_loop() -> bool:
    """Whether this thread runs an asyncio loop: a forked child would find it still running (before 3.12)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def can_fork(env: Mapping[str, str]) -> bool:
    """Whether a process with this environment may fork the run's Python children from one that imported torch:
    Linux, not turned off (SLIMECLI_TEMPLATE=0), and a CPU build of torch (CUDA does not survive a fork)."""
    from slimecli.launch.torch_build import gpu_build

    return sys.platform.startswith("linux") and env.get(TEMPLATE_ENV, "1") != "0" and not gpu_build()


def run_module(argv: list[str]) -> NoReturn:
    """Run `python -m MODULE ARGS` in this (forked) process, and end it as that command would end."""
    module, args = argv[2], argv[3:]
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exit_code(exc)
    except KeyboardInterrupt:  # as `python -m` ends on one: its traceback, then killed by SIGINT
        traceback.print_exc()
        exit_now(1, signal.SIGINT)
    except Exception:  # noqa: BLE001 - as the interpreter ends on an uncaught one
        traceback.print_exc()
        code = 1
    exit_now(code)  # without the teardown of every module: about a second with torch loaded


def _adopted(controller: int, first: int) -> None:
    """Wait until the intermediate parent has exited and the controller adopted this child; a session of its own."""
    deadline = time.monotonic() + 10.0
    while os.getppid() == first and time.monotonic() < deadline:
        time.sleep(0.0005)
    os.setsid()
    if not set_parent_death_signal(signal.SIGTERM) or os.getppid() != controller:
        os._exit(128 + signal.SIGTERM)  # not adopted by the controller (it died): must not outlive it


def _settle(argv: list[str], env: dict[str, str], cwd: str | None, out: int, threads: int) -> None:
    """What `python -m` with this environment, directory and output would have: stdin from /dev/null, stdout and
    stderr to `out`, default signal handlers, the thread count, the command line `ps` shows."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    faulthandler.unregister(signal.SIGUSR1)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if cwd:
        os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _show_as(argv)
    if argv[2] not in LAUNCHERS:  # an OpenMP pool started here would stop a launcher from forking
        threads_as_asked(threads)
    startup.forget()  # the child names itself
    sys.path[0] = os.getcwd()  # what `python -m` puts first


def _title_ready() -> None:
    """setproctitle finds the memory it rewrites from the environment as the process started: it must look
    before a child replaces its environment, so here, once, in the template."""
    try:
        from setproctitle import getproctitle, setproctitle
    except ImportError:
        return
    setproctitle(getproctitle())


def _show_as(argv: list[str]) -> None:
    """`ps` and /proc/PID/cmdline show the child's own command (one string), not the template's."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    setproctitle(" ".join(argv))


def threads_as_asked(default: int) -> None:
    """torch's intra-op threads as a fresh process with this environment would take them (set only when they
    differ: setting them starts the OpenMP pool)."""
    import torch

    asked = os.environ.get("OMP_NUM_THREADS", "")
    wanted = int(asked) if asked.isdigit() and int(asked) > 0 else default
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
