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


def port_field(default: Port = AUTO) -> Any:
    """A port field of the schema; a value of the wrong type is reported as "expected a TCP port in 1..65535, or auto"."""
    return spec(default, allowed=PORT_ALLOWED, resumable=True)  # where a server listens is no part of the run


def is_auto(port: object) -> bool:
    return port == AUTO
