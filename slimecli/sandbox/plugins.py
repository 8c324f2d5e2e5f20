"""The sandboxes this package provides, declared lazily (slimecli.config.registry): nothing is imported here.
sandbox=auto is not one of them: it picks bwrap, else podman or docker, where one starts; never local (auto.py)."""

from slimecli.config.registry import SANDBOXES

SANDBOXES.builtin("bwrap", "slimecli.sandbox.bwrap:BwrapSandbox")
SANDBOXES.builtin("local", "slimecli.sandbox.local:LocalSandbox")
SANDBOXES.builtin("docker", "slimecli.sandbox.container:ContainerSandbox", runtime="docker")
SANDBOXES.builtin("podman", "slimecli.sandbox.container:ContainerSandbox", runtime="podman")
