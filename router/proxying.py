"""Moving frames both ways between a client and its pod, with backpressure.

Each direction is one loop that reads one frame and awaits its send before reading
the next: a slow reader on one side stops the loop, the loop stops reading the other
side, and TCP flow control pushes back to the sender. Nothing is buffered beyond the
websocket libraries' own bounded queues. The first loop to end says how the stream
ended (:data:`End`); the caller decides what each side is told.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import websockets
from starlette import websockets as starlette_ws
from websockets.asyncio import client as ws_client

from asrpool.common import protocol
from asrpool.router import metrics


@dataclasses.dataclass(frozen=True)
class ClientLeft:
    code: int


@dataclasses.dataclass(frozen=True)
class TooLarge:
    size: int


@dataclasses.dataclass(frozen=True)
class PodClosed:
    code: int
    reason: str


@dataclasses.dataclass(frozen=True)
class PodLost:
    detail: str


End = ClientLeft | TooLarge | PodClosed | PodLost

# Client close codes of a lost connection (1005 no status, 1006 no close frame): the
# pod keeps the slot for a resume only if the client asked for one. This router
# shutting down (1012) always leaves its streams resumable. The router then drops its
# pod connection without a close frame, which the pod reads as lost too.
LOST_CODES = frozenset({protocol.CloseCode.NO_STATUS, protocol.CloseCode.LOST})
SHUTDOWN_CODE = protocol.CloseCode.RESTART


def detaches(end: End, resumable: bool) -> bool:
    """Whether the session waits for a resume after ``end``."""
    if not isinstance(end, ClientLeft):
        return False
    return end.code == SHUTDOWN_CODE or (resumable and end.code in LOST_CODES)


async def proxy(
    client: starlette_ws.WebSocket,
    pod: ws_client.ClientConnection,
    max_bytes: int,
    meters: metrics.Metrics,
    pod_gone: asyncio.Event,
) -> End:
    tasks = [
        asyncio.create_task(client_to_pod(client, pod, max_bytes, meters)),
        asyncio.create_task(pod_to_client(client, pod, meters)),
        asyncio.create_task(heartbeat_lapsed(pod_gone)),
    ]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return next(task for task in tasks if task in done).result()


async def heartbeat_lapsed(pod_gone: asyncio.Event) -> End:
    await pod_gone.wait()
    return PodLost("the pod's heartbeat lapsed")


async def client_to_pod(
    client: starlette_ws.WebSocket,
    pod: ws_client.ClientConnection,
    max_bytes: int,
    meters: metrics.Metrics,
) -> End:
    while True:
        message = await client.receive()
        if message["type"] == "websocket.disconnect":
            return ClientLeft(int(message.get("code") or 1005))
        data = message.get("bytes")
        if data is None:
            continue  # text frames are ignored, as by the pod
        if len(data) > max_bytes:
            return TooLarge(len(data))
        started = time.perf_counter()
        try:
            await pod.send(data)
        except websockets.ConnectionClosed as exc:
            return pod_end(exc)
        meters.forward_seconds.labels("up").observe(time.perf_counter() - started)


async def pod_to_client(
    client: starlette_ws.WebSocket,
    pod: ws_client.ClientConnection,
    meters: metrics.Metrics,
) -> End:
    while True:
        try:
            data = await pod.recv(decode=False)
        except websockets.ConnectionClosed as exc:
            return pod_end(exc)
        started = time.perf_counter()
        try:
            await client.send_bytes(data)
        except starlette_ws.WebSocketDisconnect as exc:
            return ClientLeft(exc.code)
        meters.forward_seconds.labels("down").observe(time.perf_counter() - started)


def pod_end(exc: websockets.ConnectionClosed) -> End:
    """A pod that closed with a close frame ended the stream; one that vanished failed."""
    if exc.rcvd is None:
        return PodLost(str(exc))
    return PodClosed(exc.rcvd.code, exc.rcvd.reason)
