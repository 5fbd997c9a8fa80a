"""A loopback TCP proxy that cuts every connection open at once, as a network or a load
balancer would: for clients that must resume."""

from __future__ import annotations

import asyncio
import contextlib


class CuttingProxy:
    """Loopback TCP to ``port``; :meth:`cut` aborts both sides of every connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.open: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self.connections = 0

    async def serve(self) -> asyncio.Server:
        return await asyncio.start_server(self._handle, "127.0.0.1", 0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.open.append((writer, up_writer))
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def cut(self) -> None:
        for pair in self.open:
            for writer in pair:
                writer.transport.abort()
        self.open.clear()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()
