"""The local sandbox: a private workspace, home and TMPDIR, a scrubbed environment, its own process group.

No isolation beyond that (for machines without user namespaces): README "Sandboxes" lists what an agent
can still do here. File size and data segment limits and the disk quota still apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from slimecli.sandbox.base import Launch, Sandbox, base_python, launcher_spec


class LocalSandbox(Sandbox):
    kind = "local"
    tmpdir = None

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        (self.root / "tmp").mkdir(exist_ok=True)

    def _launch(self, argv: Sequence[str], env: dict[str, str], cwd: Path) -> Launch:
        spec = launcher_spec(argv, env, cwd, self.limits())
        return Launch([base_python(), "-I", "-S", str(Path(__file__).with_name("inner.py")), *spec], env, str(cwd))
