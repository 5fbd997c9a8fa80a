"""A websocket client written from the protocol description alone (Kyutai's STT protocol).

It behaves like Kyutai's own file client when asked to: audio in 1920-sample messages
(float32 MessagePack arrays), silences in 1 s messages, a marker, then 1 s silences
until the marker comes back; optionally paced at real time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import msgpack
import numpy as np
from websockets.asyncio import client as ws_client
from websockets.exceptions import ConnectionClosed

from tests.support import streams

SAMPLE_RATE = 24_000
FRAME_SIZE = 1920


def pack(message: Mapping[str, Any]) -> bytes:
    body = dict(message)
    if isinstance(body.get("pcm"), np.ndarray):
        body["pcm"] = body["pcm"].astype(np.float32).tolist()
    return bytes(msgpack.packb(body, use_bin_type=True, use_single_float=True))


def audio(pcm: np.ndarray) -> bytes:
    return pack({"type": "Audio", "pcm": pcm})


def marker(marker_id: int) -> bytes:
    return pack({"type": "Marker", "id": marker_id})


async def connect(url: str, headers: Mapping[str, str] | None = None,
                  **kwargs: Any) -> ws_client.ClientConnection:
    """Open a stream. A pod that applies backpressure stops reading, pings included, so
    the keepalive timeout is generous (a loaded test machine steps slowly)."""
    options: dict[str, Any] = {"max_size": None, "open_timeout": 30, "ping_timeout": 120}
    return await ws_client.connect(url, additional_headers=dict(headers or {}),
                                   **(options | kwargs))


async def receive(ws: ws_client.ClientConnection, timeout: float = 30.0) -> dict[str, Any]:
    data = await asyncio.wait_for(ws.recv(), timeout)
    assert isinstance(data, bytes), f"expected a binary frame, got {data!r}"
    return dict(msgpack.unpackb(data, raw=False))


def stamp(message: dict[str, Any]) -> dict[str, Any]:
    """A received message with ``received_at`` (monotonic seconds), for benchmarks."""
    return message | {"received_at": time.monotonic()}


async def next_error(ws: ws_client.ClientConnection, timeout: float = 30.0) -> dict[str, Any]:
    """The next ``Error`` the server sent, skipping other messages; one that closes
    without an ``Error`` fails the test."""
    try:
        while (message := await receive(ws, timeout))["type"] != "Error":
            pass
    except ConnectionClosed as closed:
        raise AssertionError(f"the server closed ({closed}) without an Error") from closed
    return message


async def error_while_streaming(ws: ws_client.ClientConnection,
                                frames: int = 1000) -> dict[str, Any]:
    """Send silence in real time until the server ends the stream with an ``Error``.

    The server may send its ``Error`` and close between two of our sends; the send then
    fails, and the ``Error`` is still waiting in the receive queue."""
    silence = audio(np.zeros(FRAME_SIZE, dtype=np.float32))
    for _ in range(frames):
        try:
            await ws.send(silence)
        except ConnectionClosed:
            return await next_error(ws)
        with contextlib.suppress(asyncio.TimeoutError):
            return await next_error(ws, 0.08)
    raise AssertionError("the server never ended the stream")


async def expect(ws: ws_client.ClientConnection, kind: str,
                 timeout: float = 30.0) -> dict[str, Any]:
    message = await receive(ws, timeout)
    assert message["type"] == kind, f"expected {kind}, got {message}"
    return message


def file_messages(pcm: np.ndarray, marker_id: int = 0,
                  flush_seconds: int = 35) -> list[dict[str, Any]]:
    """Kyutai's file client: 1 s silence, 80 ms chunks, 5 s silence, marker, 1 s silences."""
    second = np.zeros(SAMPLE_RATE, dtype=np.float32)
    out: list[dict[str, Any]] = [{"type": "Audio", "pcm": second}]
    out += [{"type": "Audio", "pcm": pcm[i:i + FRAME_SIZE]} for i in range(0, len(pcm), FRAME_SIZE)]
    out += [{"type": "Audio", "pcm": second}] * 5
    out.append({"type": "Marker", "id": marker_id})
    out += [{"type": "Audio", "pcm": second}] * flush_seconds
    return out


def short_messages(pcm: np.ndarray, marker_id: int = 0) -> list[dict[str, Any]]:
    """A shorter session than the file client's: the audio, a marker, 1 s silences."""
    second = np.zeros(SAMPLE_RATE, dtype=np.float32)
    out: list[dict[str, Any]] = [
        {"type": "Audio", "pcm": pcm[i:i + FRAME_SIZE]} for i in range(0, len(pcm), FRAME_SIZE)]
    out.append({"type": "Marker", "id": marker_id})
    return out + [{"type": "Audio", "pcm": second}] * 5


async def send_paced(ws: ws_client.ClientConnection, messages: Iterable[Mapping[str, Any]],
                     realtime: float | None = None) -> None:
    """Send messages; with ``realtime`` (1.0 = real time), pace audio by its duration."""
    started, sent_seconds = time.monotonic(), 0.0
    for message in messages:
        await ws.send(pack(message))
        if realtime and message["type"] == "Audio":
            sent_seconds += len(message["pcm"]) / SAMPLE_RATE
            delay = started + sent_seconds / realtime - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)


async def until_marker(ws: ws_client.ClientConnection, marker_id: int,
                       timeout: float = 60.0) -> list[dict[str, Any]]:
    """Every message up to and including the Marker ``marker_id``."""
    deadline = time.monotonic() + timeout
    out: list[dict[str, Any]] = []
    while True:
        message = stamp(await receive(ws, max(0.1, deadline - time.monotonic())))
        out.append(message)
        if message["type"] == "Error":
            raise AssertionError(f"server error: {message}")
        if message["type"] == "Marker" and message["id"] == marker_id:
            return out


async def transcribe(url: str, pcm: np.ndarray, realtime: float | None = None,
                     headers: Mapping[str, str] | None = None, timeout: float = 120.0,
                     short: bool = False) -> list[dict[str, Any]]:
    """The whole file-client session: Ready, then every message up to the marker."""
    messages = short_messages(pcm) if short else file_messages(pcm)
    async with await connect(url, headers) as ws:
        await expect(ws, "Ready")
        sender = asyncio.create_task(send_paced(ws, messages, realtime))
        try:
            return await until_marker(ws, 0, timeout)
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)


def words(messages: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """The Word and EndWord messages as (type, text or time) pairs, for comparisons."""
    out: list[tuple[Any, ...]] = []
    for message in messages:
        if message["type"] == "Word":
            out.append(("Word", message["text"], message["start_time"]))
        elif message["type"] == "EndWord":
            out.append(("EndWord", message["stop_time"]))
    return out


@dataclasses.dataclass
class PacedStream:
    """A stream of noise sent at real time until :meth:`finish` (see :func:`paced_stream`)."""

    stop: asyncio.Event
    sender: asyncio.Task[None]
    received: asyncio.Task[list[dict[str, Any]]]

    def is_open(self) -> bool:
        return not self.received.done()

    async def finish(self) -> list[dict[str, Any]]:
        """Stop the audio, send the marker and flush; every message up to the marker."""
        self.stop.set()
        transcript = await self.received
        await self.sender
        return transcript


@contextlib.asynccontextmanager
async def paced_stream(url: str, ready_timeout: float, timeout: float,
                       headers: Mapping[str, str] | None = None) -> AsyncIterator[PacedStream]:
    async with await connect(url, headers) as ws:
        await expect(ws, "Ready", ready_timeout)
        stop = asyncio.Event()
        stream = PacedStream(
            stop, asyncio.create_task(send_paced(ws, streams.audio_until(stop), realtime=1.0)),
            asyncio.create_task(until_marker(ws, 0, timeout=timeout)))
        try:
            yield stream
        finally:
            for task in (stream.sender, stream.received):
                task.cancel()
