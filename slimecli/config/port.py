"""The type of a server's port in the schema: a TCP port, or "auto" for a free one picked when it starts.

A fixed default port fails a second run on a shared machine ("in use"); with "auto" each run takes ports
nothing else holds (slimecli/launch/free_ports.py) and records them in its plan.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from slimecli.config.decode import spec

AUTO: Literal["auto"] = "auto"
MAX_PORT = 65535
Port = Union[int, Literal["auto"]]  # noqa: UP007 - a runtime value the schema converter reads
PORT_ALLOWED = f"a TCP port in 1..{MAX_PORT}, or auto"


def port_field(default: Port = AUTO, zero_is_auto: bool = False) -> Any:
    """A port field of the schema: "expected a TCP port in 1..65535, or auto" for a value of the wrong type,
    "must be ..." for one out of range. zero_is_auto: 0 is an older spelling of auto (the server reports the port
    it got). Where a server listens is no part of the run: a resume may change it."""
    if zero_is_auto:
        return spec(default, ge=0, le=MAX_PORT, allowed=PORT_ALLOWED, note="or 0, the same as auto", resumable=True)
    return spec(default, ge=1, le=MAX_PORT, allowed=PORT_ALLOWED, resumable=True)


def is_port_key(path: str) -> bool:
    """A port field's key: a leaf named `port` or `*_port` (a resume may change them all)."""
    leaf = path.rsplit(".", 1)[-1]
    return leaf == "port" or leaf.endswith("_port")


def is_auto(port: object) -> bool:
    return port == AUTO
