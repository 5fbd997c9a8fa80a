"""The least a Python byte relay can do, for ``asrpool bench router --baseline nginx``.

    python -m asrpool_harness.bench.floor_relay PORT BACKEND_PORT

Each accepted connection gets one to the backend; every read from either side is
written to the other as is (handshake included), on uvloop. No admission, framing,
limits, liveness or metrics: what it costs per message is the floor of any relay
written in Python on uvloop, the router's included, so the benchmark reports the
router's cost over it beside its cost over nginx's.
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast


class _Backend(asyncio.Protocol):
    def __init__(self, client: _Client) -> None:
        self.client = client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.client.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.transport.close()


class _Client(asyncio.Protocol):
    def __init__(self, backend_port: int) -> None:
        self.backend_port = backend_port
        self.backend: _Backend | None = None
        self.dialling: asyncio.Task[None] | None = None
        self.early: list[bytes] = []  # the handshake, read before the backend is there

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.dialling = asyncio.ensure_future(self._dial())

    async def _dial(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, self.backend = await loop.create_connection(
                lambda: _Backend(self), "127.0.0.1", self.backend_port)
        except OSError:
            self.transport.close()
            return
        self.backend.transport.write(b"".join(self.early))

    def data_received(self, data: bytes) -> None:
        if self.backend is None:
            self.early.append(data)
        else:
            self.backend.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.backend is not None:
            self.backend.transport.close()


async def serve(port: int, backend_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(backend_port), "127.0.0.1", port,
                                      backlog=4096)
    await server.serve_forever()


def main() -> None:
    import uvloop

    uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2])))


if __name__ == "__main__":
    main()
