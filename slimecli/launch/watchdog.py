"""Children of a controller that was SIGKILLed must not live on.

Direct children get a parent-death signal from the kernel (slimecli.launch.pdeathsig);
grandchildren (torchrun workers) run this watchdog, which ends their process group when the
controller is gone.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from slimecli.process import alive, signal_group

PARENT_ENV = "SLIMECLI_CONTROLLER_PID"


def _terminate_group(signum: int, _frame: object) -> None:
    signal.signal(signum, signal.SIG_DFL)
    signal_group(os.getpgid(0), signum)  # ourselves included, now with the default action


def start_parent_watchdog(interval_s: float = 1.0) -> threading.Thread | None:
    """Watch the controller named in the environment; end our process group when it dies.

    A process-group leader also passes SIGTERM on to its whole group, so that helpers it
    spawned die with it when the kernel's parent-death signal arrives.
    """
    pid = int(os.environ.get(PARENT_ENV, "0") or 0)
    if pid <= 0:
        return None
    if os.getpgid(0) == os.getpid() and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate_group)

    def watch() -> None:
        while alive(pid):
            time.sleep(interval_s)
        try:
            signal_group(os.getpgid(0), signal.SIGTERM)
        finally:
            time.sleep(3)
            os._exit(1)

    thread = threading.Thread(target=watch, name="slimecli-parent-watchdog", daemon=True)
    thread.start()
    return thread
