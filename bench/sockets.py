"""What a pod's websocket layer costs per message: the part ``bench capacity`` leaves out.

``bench capacity`` counts the pod's host work from a message's bytes onwards. Getting
those bytes off the socket, and a result's bytes onto it, is the event loop's work too.
This measures it alone: a real uvicorn with the pod's protocols and options
(``limits.uvicorn_options``: ``framing.WebSocketProtocol``, no permessage-deflate) in a
child process, whose app receives ``count`` messages of the given bytes and then sends
``count`` messages of the reply's bytes, against a real ``websockets`` client in this
process. The figures are the server process's CPU time per
message in each direction (``time.process_time``: the time the machine gave the client
is not counted).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from multiprocessing import queues
from typing import Any

from websockets.sync import client as ws_client

from asrpool.common import processes

_START_TIMEOUT_S = 30.0


def socket_costs(message_bytes: int, reply_bytes: int, count: int = 5000) -> dict[str, float]:
    """Server CPU in us per binary message received (``message_bytes`` long) and per
    message sent (``reply_bytes``); their content is nothing to the websocket layer."""
    message, reply = os.urandom(message_bytes), os.urandom(reply_bytes)
    context = multiprocessing.get_context("spawn")
    results: queues.Queue[Any] = context.Queue()
    port = processes.free_port()
    server = context.Process(target=_serve, args=(port, count, reply, results), daemon=True)
    server.start()
    try:
        with _connect(port) as websocket:
            for _ in range(count):
                websocket.send(message)
            for _ in range(count):
                websocket.recv()
        received_s, sent_s = results.get(timeout=_START_TIMEOUT_S)
    finally:
        server.join(5)
        if server.is_alive():
            server.kill()
            server.join()
    return {"receive_us": round(received_s * 1e6 / count, 2),
            "send_us": round(sent_s * 1e6 / count, 2),
            "message_bytes": message_bytes, "reply_bytes": reply_bytes, "messages": count}


def _connect(port: int) -> ws_client.ClientConnection:
    """The child's server, once it listens."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        try:
            return ws_client.connect(f"ws://127.0.0.1:{port}/", compression=None,
                                     max_size=None, open_timeout=_START_TIMEOUT_S)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _serve(port: int, count: int, reply: bytes, results: queues.Queue[Any]) -> None:
    """The child: one websocket, ``count`` messages in, ``count`` replies out."""
    import uvicorn

    from asrpool.common import limits

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        started = time.process_time()
        for _ in range(count):
            await receive()
        received = time.process_time() - started
        started = time.process_time()
        for _ in range(count):
            await send({"type": "websocket.send", "bytes": reply})
        results.put((received, time.process_time() - started))
        await receive()  # the client's close
        server.should_exit = True

    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                            log_level="warning", **limits.uvicorn_options(limits.Limits()))
    server = uvicorn.Server(config)
    asyncio.run(server.serve())
