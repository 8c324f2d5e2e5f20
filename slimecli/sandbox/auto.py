"""sandbox=auto: the first kind that starts here, never `local`.

1. bwrap, where a probe sandbox starts (bwrap.available: user namespaces work).
2. Else podman, then docker, where the client and its daemon answer, every image the run needs is among its local
   images (auto never pulls), and a probe container of that image starts and runs the launcher. As root that is
   the rootful runtime; as any other user, a rootless one: a runtime whose containers run under root (a docker
   daemon, a podman connection to a root service) is passed over, as whoever may drive it is root on the
   machine; `sandbox=docker` takes it by name.
3. Else none: the commands that run model-written code refuse to start (exit 2 at validation, with how to
   install bubblewrap), and a sandbox asked for at run time raises. Running without isolation is a choice the
   user makes by name, `sandbox=local`.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass

from slimecli.config.groups.sandbox import SandboxConfig

log = logging.getLogger(__name__)
CONTAINER_ORDER = ("podman", "docker")
INSTALL_BWRAP = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora/RHEL: dnf install "
                 "bubblewrap; Arch: pacman -S bubblewrap; openSUSE: zypper install bubblewrap) on a kernel with "
                 "user namespaces enabled")
AUTO_HINT = (f"{INSTALL_BWRAP}; or podman/docker with sandbox.image present locally; or choose sandbox=local "
             "explicitly to run the agent's commands without isolation")


@dataclass(frozen=True)
class Choice:
    """What auto picked (None: nothing starts here) and why each kind before it was passed over."""

    kind: str | None
    passed_over: tuple[tuple[str, str], ...] = ()

    def why_none(self) -> str:
        return "; ".join(why if why.startswith(kind) else f"{kind}: {why}" for kind, why in self.passed_over)

    def describe(self) -> str:
        """One line for the start of a run: the kind, and what was passed over to get there."""
        if self.kind is None:
            return (f"sandbox=auto takes bwrap, else {' or '.join(CONTAINER_ORDER)} with its image local; none "
                    f"starts here: {self.why_none()}")
        skipped = f" ({self.why_none()})" if self.passed_over else ""
        return f"sandbox=auto: {self.kind}{skipped}"


def images(settings: SandboxConfig) -> tuple[str, ...]:
    """The images a run in a container sandbox of `auto` needs: sandbox.image, the image of every agent run and
    grading (a task row's own image needs task.environment=image, which auto does not take: it names the
    runtime explicitly)."""
    return (settings.image,) if settings.image else ()


ROOTLESS_FIELD = {"docker": "{{json .SecurityOptions}}", "podman": "{{.Host.Security.Rootless}}"}


def rootful(runtime: str, binary: str) -> bool:
    """Whether the containers of `binary` run under a root daemon or service (docker: its security options name
    "rootless" otherwise; podman: its info says Rootless, unless a remote connection leads to a root service)."""
    try:
        proc = subprocess.run([binary, "info", "--format", ROOTLESS_FIELD[runtime]], capture_output=True, text=True,
                              timeout=20)
    except (OSError, subprocess.SubprocessError):
        return True
    return "rootless" not in proc.stdout if runtime == "docker" else proc.stdout.strip() != "true"


def image_local(runtime: str, image: str, binary: str | None = None) -> str | None:
    """None when `image` is among the runtime's local images (nothing is pulled), else why not."""
    found = shutil.which(binary or runtime) or binary or runtime
    try:
        proc = subprocess.run([found, "image", "inspect", image], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot look for the image {image}: {exc}"
    if proc.returncode == 0:
        return None
    return (f"the image {image} is not among its local images (auto never pulls: `{runtime} pull {image}` or build "
            "it, or set sandbox.image)")


def container_problem(runtime: str, settings: SandboxConfig) -> str | None:
    """None when auto may take `runtime` here: it answers, as the right user, has the images, and starts one."""
    from slimecli.sandbox.container import ContainerSandbox, runtime_missing

    missing = runtime_missing(runtime, settings.binary)
    if missing is not None:
        return missing
    binary = shutil.which(settings.binary or runtime) or runtime
    if os.geteuid() != 0 and runtime in ROOTLESS_FIELD and rootful(runtime, binary):
        return (f"it runs containers as root; as a user other than root, auto takes only a rootless runtime "
                f"(choose sandbox={runtime} explicitly to use this one)")
    needed = images(settings)
    if not needed:
        return "no sandbox.image to run"
    for image in needed:
        problem = image_local(runtime, image, settings.binary)
        if problem is not None:
            return problem
    try:
        box = ContainerSandbox(settings=settings, runtime=runtime, image=needed[0])
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return f"cannot prepare a container: {exc}"
    try:
        launch = box._prepare(["/bin/true"], None, None)
        proc = subprocess.run(launch.argv, env=launch.env, cwd=launch.cwd, capture_output=True, text=True,
                              timeout=settings.start_timeout_s)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"a container of {needed[0]} does not start: {exc}"
    finally:
        box.close()
    if proc.returncode != 0:
        tail = proc.stderr.strip()[-300:] or f"exit {proc.returncode}"
        return f"a container of {needed[0]} does not start: {tail}"
    return None


@functools.cache
def choose(settings: SandboxConfig) -> Choice:
    """The kind `auto` runs as with these settings, once per process."""
    from slimecli.sandbox.bwrap import available

    passed: list[tuple[str, str]] = []
    why = available()
    if why is None:
        return Choice("bwrap")
    passed.append(("bwrap", why))
    for runtime in CONTAINER_ORDER:
        why = container_problem(runtime, settings)
        if why is None:
            choice = Choice(runtime, tuple(passed))
            log.info("%s", choice.describe())
            return choice
        passed.append((runtime, why))
    return Choice(None, tuple(passed))
