"""The local sandbox: a private workspace, home and TMPDIR, a scrubbed environment, its own process group.

No isolation beyond that: docs/sandboxes.md lists what an agent can still do here (LOCAL_GAPS), and a run that
chose it says so when it starts and in its summary. What it does bound:
- max_file_mb and memory_mb: the launcher's rlimits (they bind root too).
- disk_mb: the base class's watchdog over the workspace, home and the private TMPDIR.
- max_processes: a pids cgroup of its own (pids.py), where slimecli may make one (as root, usually); elsewhere
  `unheld` says the limit does not apply, as RLIMIT_NPROC would count the user's every process (or, for root,
  none).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.sandbox import pids
from slimecli.sandbox.base import Launch, Sandbox, base_python, launcher_spec

AS_ROOT = ("as root, its commands run as root: they could lift its limits themselves (raise their rlimits, leave "
           "the pids cgroup) and write anywhere")


class LocalSandbox(Sandbox):
    kind = "local"
    tmpdir = None

    @classmethod
    def unheld(cls, settings: SandboxConfig) -> list[str]:
        """Which of the settings' limits do not hold here, each with why (empty: every one holds)."""
        out = []
        why = pids.unavailable()
        if why is not None:
            out.append(f"sandbox.max_processes={settings.max_processes} does not apply here: {why}")
        if os.geteuid() == 0:
            out.append(AS_ROOT)
        return out

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        (self.root / "tmp").mkdir(exist_ok=True)
        self.cgroup: pids.PidsCgroup | None = None
        if pids.unavailable() is None:
            try:
                self.cgroup = pids.PidsCgroup(self.settings.max_processes)
            except BaseException:
                self.close()
                raise

    def _quota_roots(self) -> tuple[Path, ...]:
        return (self.workdir, self.home, self.root / "tmp")

    def _launch(self, argv: Sequence[str], env: dict[str, str], cwd: Path) -> Launch:
        cgroup = self.cgroup.procs if self.cgroup is not None else None
        spec = launcher_spec(argv, env, cwd, self.limits(), cgroup=cgroup)
        return Launch([base_python(), "-I", "-S", str(Path(__file__).with_name("inner.py")), *spec], env, str(cwd))

    def _release(self) -> None:
        if self.cgroup is not None:  # everything the commands left running, setsid'd strays included
            self.cgroup.remove()
            self.cgroup = None
