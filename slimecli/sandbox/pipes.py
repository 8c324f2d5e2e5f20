"""The output pipes of one sandboxed command, read into buffers and known by inode (see Sandbox.exec)."""

from __future__ import annotations

import asyncio
import functools
import os

DRAIN_S = 5.0  # after a kill at the time limit, how long the output still left in the pipes is read


class Pipes:
    """The stdout and stderr pipes of one exec: read into buffers, so output read before a kill is kept, and
    known by inode, so a process still holding them after the command's group died can be found."""

    def __init__(self) -> None:
        pairs = [os.pipe(), os.pipe()]
        self.read_ends = [r for r, _ in pairs]
        self.write_ends = [w for _, w in pairs]
        self.inodes = [os.fstat(r).st_ino for r in self.read_ends]
        self.buffers = [bytearray(), bytearray()]
        self._transports: list[asyncio.BaseTransport] = []

    def started(self) -> None:
        for w in self.write_ends:  # only the command holds them now
            os.close(w)
        self.write_ends = []

    async def readers(self) -> list[asyncio.Future[object]]:
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Future[object]] = []
        for fd, buffer in zip(self.read_ends, self.buffers, strict=True):
            reader = asyncio.StreamReader(limit=1 << 16)
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await loop.connect_read_pipe(functools.partial(_same, protocol),
                                                        os.fdopen(fd, "rb", buffering=0))
            self._transports.append(transport)
            tasks.append(asyncio.ensure_future(_drain(reader, buffer)))
        self.read_ends = []
        self._tasks = tasks
        return tasks

    def close(self) -> None:
        for task in getattr(self, "_tasks", []):
            task.cancel()
        for transport in self._transports:
            transport.close()
        for fd in (*self.read_ends, *self.write_ends):
            os.close(fd)
        self.read_ends, self.write_ends, self._transports = [], [], []

    def text(self) -> tuple[str, str]:
        out, err = (bytes(b).decode(errors="replace") for b in self.buffers)
        return out, err


def _same(protocol: asyncio.StreamReaderProtocol) -> asyncio.StreamReaderProtocol:
    return protocol


async def _drain(reader: asyncio.StreamReader, buffer: bytearray) -> None:
    while chunk := await reader.read(1 << 16):
        buffer += chunk
