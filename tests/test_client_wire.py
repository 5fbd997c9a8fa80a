"""What the stream client puts on the wire: a file and a live source send their samples
alike, as 32-bit floats (Kyutai's clients' form), to a real websocket server that
records each frame and answers the marker."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import numpy as np
from websockets.asyncio.server import ServerConnection, serve

from asrpool.client import streaming
from asrpool.common import audio, protocol

FLOAT32, FLOAT64 = 0xCA, 0xCB  # msgpack's markers


async def _recorded(send: Any) -> list[bytes]:
    """The binary frames a client sent to a server that answers its marker."""
    frames: list[bytes] = []

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            assert isinstance(frame, bytes)
            frames.append(frame)
            message = msgpack.unpackb(frame)
            if message["type"] == "Marker":
                await ws.send(msgpack.packb(message))  # and read on until the client closes

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        await send(f"ws://127.0.0.1:{port}")
    return frames


def _float_markers(frame: bytes) -> set[int]:
    """The msgpack float markers of an Audio frame's samples."""
    message = msgpack.unpackb(frame)
    assert message["type"] == "Audio" and message["pcm"]
    head = frame.index(b"pcm") + 3
    array = frame[head]
    first = head + (1 if array & 0xF0 == 0x90 else 3 if array == 0xDC else 5)
    size = {FLOAT32: 5, FLOAT64: 9}[frame[first]]
    markers = {frame[first + i * size] for i in range(len(message["pcm"]))}
    return markers


def test_a_file_and_a_live_source_send_32_bit_samples() -> None:
    pcm = (0.25 * np.sin(np.arange(protocol.SAMPLE_RATE // 2) / 9)).astype(np.float32)

    async def from_file(url: str) -> None:
        result = await streaming.stream_messages(
            url, audio.kyutai_file_messages(pcm, marker_id=streaming.MARKER_ID), rtf=1000.0)
        assert result.marker_seen

    async def live(url: str) -> None:
        async def frames() -> AsyncIterator[Any]:
            for start in range(0, len(pcm), protocol.FRAME_SIZE):
                yield pcm[start:start + protocol.FRAME_SIZE]

        result = await streaming.stream_live(url, frames(), timeout=5.0)
        assert result.marker_seen

    for send in (from_file, live):
        frames = asyncio.run(_recorded(send))
        audio_frames = [f for f in frames if msgpack.unpackb(f)["type"] == "Audio"]
        assert audio_frames, send.__name__
        assert set().union(*map(_float_markers, audio_frames)) == {FLOAT32}, send.__name__
        # And the values are the samples', to a float32's precision.
        first = msgpack.unpackb(audio_frames[-1])["pcm"]
        assert all(struct.pack(">f", v) == struct.pack(">f", np.float32(v)) for v in first)
