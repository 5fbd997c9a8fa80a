"""The pods' and routers' websocket protocol reads on while few messages wait for the
application, and pauses the socket once they hold ``QUEUED_BYTES`` or number
``QUEUED_MESSAGES`` (backpressure), resuming once the application took them all: a real
uvicorn with the protocol, a real client, nothing lost or reordered."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from websockets.asyncio import client as ws_client

from asrpool.common import framing, limits, processes


async def _held_back(count: int, size: int) -> tuple[bool, int, int, list[bytes]]:
    """A client sends ``count`` messages of ``size`` bytes to an app that waits before
    it reads: whether the socket was being read while it waited, the messages and bytes
    waiting then, and every message as the app then received it."""
    seen: dict[str, Any] = {}
    done = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        protocol = scope["extensions"][framing.HANDOVER]["protocol"]
        await asyncio.sleep(1.0)  # the client sends everything meanwhile
        seen.update(reading=protocol.transport.is_reading(), queued=protocol.queue.qsize(),
                    queued_bytes=protocol.queue.bytes)
        seen["messages"] = [(await receive())["bytes"] for _ in range(count)]
        done.set()
        await receive()  # the client's close

    port = processes.free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                                           log_level="warning",
                                           **limits.uvicorn_options(limits.Limits())))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        async with ws_client.connect(f"ws://127.0.0.1:{port}/", compression=None) as ws:
            for index in range(count):
                await ws.send(index.to_bytes(4, "big") * (size // 4))
                if index % 8 == 7:
                    await asyncio.sleep(0.002)  # a few messages to a read, as streams send
            await asyncio.wait_for(done.wait(), 30)
    finally:
        server.should_exit = True
        await serving
    return seen["reading"], seen["queued"], seen["queued_bytes"], seen["messages"]


@pytest.mark.parametrize(("count", "size"), [(400, 8), (12, 100_000)])
async def test_reading_pauses_once_the_waiting_messages_reach_the_bound(
        count: int, size: int) -> None:
    reading, queued, queued_bytes, messages = await _held_back(count, size)
    assert not reading, "the socket was still read with the application not reading"
    assert queued < count, "every message was read: no backpressure"
    assert queued >= framing.QUEUED_MESSAGES or queued_bytes >= framing.QUEUED_BYTES
    assert queued < framing.QUEUED_MESSAGES + 8 and queued_bytes < framing.QUEUED_BYTES + 8 * size
    assert queued_bytes == queued * size
    assert messages == [index.to_bytes(4, "big") * (size // 4) for index in range(count)]


async def test_a_few_waiting_messages_leave_the_socket_read() -> None:
    reading, queued, queued_bytes, messages = await _held_back(5, 100)
    assert reading and queued == 5 and queued_bytes == 500 and len(messages) == 5
