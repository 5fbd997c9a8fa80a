"""A client that sends a message over the size limit right behind its audio: one frame,
or a fragmented message (a first binary frame without FIN, then continuation frames)
that a slow uplink sends a fragment at a time, each under the limit or the first over.

The audio is 25 frames of speech-like noise, a marker and silence enough for that
marker to come back: a pod or router that delivers the results of the audio before the
refused message sends the marker before its ``Error``. The client reads nothing until it
has sent all (as a client that sends a file, then reads the answers), and its fragments
go on until the server has ended the stream and a few more: a server that stops reading
and drops the connection at its end, its unsent output and the client's unread input
with it (a reset), loses the ``Error`` and the close.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import websockets
from websockets.asyncio import client as ws_client

from asrpool.common import protocol
from tests.support import kyutai_client, streams

LIMIT = protocol.DEFAULT_MAX_MESSAGE_BYTES
MARKER_ID = 7
FRAMES_BEFORE = 25
PAUSE_S = 0.02  # between fragments, as a slow uplink
FRAGMENTS_AFTER = 4  # sent once the stream is over, before the last one
MAX_FRAGMENTED = 1 << 30  # bytes: a server that never ends the stream ends the sending


@dataclasses.dataclass(frozen=True)
class Oversized:
    """One frame of ``size`` bytes, or fragments of ``size`` bytes until the server
    closes (``fragmented``)."""

    size: int
    fragmented: bool = False

    @property
    def refused_size(self) -> int:
        """The size a refusal names: the frame's, or that of the fragments up to the one
        that takes the message over the limit."""
        return (LIMIT // self.size + 1) * self.size if self.fragmented else self.size


# The fragments of 2 MiB reach the limit exactly before the one that passes it; those of
# 3 MiB stop short of it (15 MiB); the first of 17 MiB passes it alone.
SHAPES = {
    "one frame": Oversized(17 << 20),
    "2 MiB fragments": Oversized(2 << 20, fragmented=True),
    "3 MiB fragments": Oversized(3 << 20, fragmented=True),
    "17 MiB fragments": Oversized(17 << 20, fragmented=True),
}


async def send_after_audio(ws: ws_client.ClientConnection, message: Oversized,
                           over: Callable[[], bool]) -> None:
    """Send the audio and its marker, then ``message``: fragments until ``over()`` says
    the server has ended the stream, and a few more."""
    speech = streams.random_speechlike(FRAMES_BEFORE * kyutai_client.FRAME_SIZE / 24_000, 5)
    silence = np.zeros(kyutai_client.SAMPLE_RATE, dtype=np.float32)
    with contextlib.suppress(websockets.ConnectionClosed):  # a server that failed early
        for frame in streams.frames_of(speech):
            await ws.send(kyutai_client.audio(frame))
        await ws.send(kyutai_client.marker(MARKER_ID))
        for _ in range(3):
            await ws.send(kyutai_client.audio(silence))
        if message.fragmented:
            await ws.send(_fragments(message.size, over))
        else:
            await ws.send(bytes(message.size))


async def until_closed(ws: ws_client.ClientConnection) -> list[dict[str, Any]]:
    """Every message the server sends until it closes, and its close."""
    told: list[dict[str, Any]] = []
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            told.append(await kyutai_client.receive(ws, timeout=60))
    await asyncio.wait_for(ws.wait_closed(), 20)
    return told


def check_refused(told: list[dict[str, Any]], close_code: int | None,
                  message: Oversized) -> None:
    """The marker came back, then ``Error{code:"too_large"}`` naming the sizes, last,
    then close 1009."""
    types = [m["type"] for m in told]
    assert told and told[-1]["type"] == "Error", types[-5:]
    error = told[-1]
    assert error["code"] == "too_large", error
    assert f"{message.refused_size} bytes exceeds the limit of {LIMIT}" in error["message"]
    assert any(m["type"] == "Marker" and m["id"] == MARKER_ID for m in told), \
        f"the results of the audio before the message are lost: {types}"
    assert close_code == protocol.CloseCode.TOO_LARGE


async def _fragments(size: int, over: Callable[[], bool]) -> AsyncIterator[bytes]:
    fragment = bytes(size)
    for _ in range(MAX_FRAGMENTED // size):
        yield fragment
        await asyncio.sleep(PAUSE_S)
        if await asyncio.to_thread(over):
            break
    for _ in range(FRAGMENTS_AFTER):
        yield fragment

