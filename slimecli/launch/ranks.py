"""The ranks of one node without torchrun: `python -m slimecli.launch.ranks --nproc N -m MODULE ARGS...`.

torchrun's agent costs a Python start with torch imported, and each rank it starts imports torch and
transformers again (about 2.5 CPU-seconds each, most of a short run's start-up). On one node nothing needs its
rendezvous or restarts (the controller restarts a run), so this launcher does its part instead, and with a CPU
build of torch it is also the ranks' template: it imports what a rank imports once, before any thread exists,
then forks the ranks, which start with those modules loaded. With a GPU build (whose CUDA must not be touched
before a fork), or with SLIMECLI_FORK_RANKS=0, it starts each rank as `python -m MODULE` instead.

What the ranks get is what torchrun gives them: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR and MASTER_PORT (a free local port: rank 0 hosts the store), and OMP_NUM_THREADS=1 for several
ranks unless the environment sets it (set here before torch loads, so a forked rank's OpenMP reads it as an
exec'd one's does). The ranks stay in this process's group and die with it (parent-death signal); when a rank
fails, the others get SIGTERM, then SIGKILL after a grace period, and the launcher exits 1 after a line naming
the rank as torchrun does ("failed (exitcode: N) local_rank: K" and its "Root Cause" entry, which
launch/failure.py reads).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import runpy
import signal
import subprocess
import sys
import time

from slimecli.launch.torch_build import gpu_build
from slimecli.net.ports import free_port
from slimecli.observe import startup

# What a rank of these modules imports before its first step (their own imports are inside main()).
PRELOAD = {
    "slimecli.train": ("slimecli.train.loop", "slimecli.rollout.client", "slimecli.model.loading",
                       "transformers.modeling_utils", "transformers.models.auto.modeling_auto",
                       "transformers.models.auto.tokenization_auto", "aiohttp"),
    "slimecli.teacher": ("slimecli.teacher.__main__", "transformers.modeling_utils",
                         "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto"),
}
# What the ranks of a megatron-core trainer or teacher import besides (`--preload`, from the run's plan): its
# builder first, which on a CPU keeps megatron-core's import from loading torch's compiler; 3 CPU-seconds a rank.
MEGATRON_PRELOAD = ("slimecli.model.megatron.build", "megatron.core.models.gpt.gpt_model",
                    "megatron.core.transformer.transformer_config")
GRACE_S = 10.0
FORK_ENV = "SLIMECLI_FORK_RANKS"  # "0": start each rank as `python -m MODULE` (imports its own torch)
PROG = "slimecli.launch.ranks"


def rank_env(rank: int, nproc: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": "0", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nproc), "GROUP_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def preload(module: str, extra: tuple[str, ...] = ()) -> bool:
    """Import what a rank of ``module`` needs (and ``extra``: what the run's settings add, such as megatron-core);
    True when this process may then fork (still one thread)."""
    for name in ("torch", *PRELOAD.get(module, ()), *extra):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the rank's own import will say what is wrong
            return False
    return threads() == 1


def run_rank(module: str, args: list[str], launcher: int) -> int:
    """In a forked child: become the rank, as `python -m module args` would be."""
    from slimecli.launch.pdeathsig import set_parent_death_signal

    if set_parent_death_signal(signal.SIGTERM) and os.getppid() != launcher:
        return 128 + signal.SIGTERM  # the launcher is already gone
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if "torch" in sys.modules:  # loaded before OMP_NUM_THREADS was set (this launcher was forked from a template)
        from slimecli.launch.template import default_threads, threads_as_asked

        threads_as_asked(default_threads())
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)  # its sys.exit() ends this process
    return 0


def stop(pids: dict[int, int], grace_s: float) -> None:
    """SIGTERM every rank still running (and SIGCONT: a stopped one handles it at once), SIGKILL those left after
    ``grace_s``; reap them all."""
    for pid in pids:
        _kill(pid, signal.SIGTERM)
        _kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        _reap(pids)
        time.sleep(0.05)
    for pid in list(pids):
        _kill(pid, signal.SIGKILL)
    while pids:
        pid, _ = os.waitpid(-1, 0)
        pids.pop(pid, None)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pids: dict[int, int]) -> list[tuple[int, int]]:
    """(rank, exit code: negative for a signal) of every rank that ended, removed from ``pids``."""
    ended = []
    while pids:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if pid in pids:
            ended.append((pids.pop(pid), os.waitstatus_to_exitcode(status)))
    return ended


class _Stopped(BaseException):
    def __init__(self, signum: int) -> None:
        self.signum = signum


def supervise(pids: dict[int, int], grace_s: float = GRACE_S) -> int:
    """Wait for the ranks: 0 when all exit 0; else stop the rest and return 1 (as torchrun), or 128+N when this
    launcher got signal N."""
    def on_signal(signum: int, _frame: object) -> None:
        raise _Stopped(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        while pids:
            for rank, code in _reap(pids):
                if code != 0:
                    print(f"{PROG}: rank {rank} failed (exitcode: {code}) local_rank: {rank}; stopping the "
                          f"{len(pids)} other rank(s)\nRoot Cause (first observed failure):\n  rank      : {rank}\n"
                          f"  exitcode  : {code}", file=sys.stderr, flush=True)
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                    stop(pids, grace_s)
                    return 1
            time.sleep(0.05)
        return 0
    except _Stopped as exc:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        stop(pids, grace_s)
        return 128 + exc.signum


def main(argv: list[str]) -> int:
    extra: tuple[str, ...] = ()
    if len(argv) > 4 and argv[2] == "--preload":
        extra, argv = tuple(m for m in argv[3].split(",") if m), argv[:2] + argv[4:]
    if len(argv) < 4 or argv[0] != "--nproc" or argv[2] != "-m" or not argv[1].isdigit() or int(argv[1]) < 1:
        print(f"usage: python -m {PROG} --nproc N [--preload MODULE,...] -m MODULE [ARG...]", file=sys.stderr)
        return 2
    nproc, module, args = int(argv[1]), argv[3], argv[4:]
    if nproc > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"  # torchrun's default for several ranks, before any OpenMP loads
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    fork = os.environ.get(FORK_ENV, "1") != "0" and not gpu_build() and preload(module, extra)
    if fork:
        from slimecli.launch.template import freeze_imports

        freeze_imports()
    startup.name(f"ranks of {module}")
    startup.mark("imported")
    port, launcher = free_port(), os.getpid()
    pids: dict[int, int] = {}
    started: list[subprocess.Popen[bytes]] = []  # without a fork: reaped by pid like the forked ones
    for rank in range(nproc):
        env = rank_env(rank, nproc, port)
        if not fork:
            started.append(subprocess.Popen([sys.executable, "-m", module, *args], env={**os.environ, **env}))
            pids[started[-1].pid] = rank
            continue
        pid = os.fork()
        if pid == 0:
            os.environ.update(env)
            return run_rank(module, args, launcher)
        pids[pid] = rank
    return supervise(pids)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
