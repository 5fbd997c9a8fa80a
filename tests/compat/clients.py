"""What real Kyutai clients do on the wire, and Ogg Opus made in-process with sphn."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import sphn
from websockets import frames
from websockets.asyncio import client as ws_client

from tests.compat import conftest
from tests.support import kyutai_client

SECOND = kyutai_client.SAMPLE_RATE
FRAME = kyutai_client.FRAME_SIZE


async def connect(endpoint: conftest.Endpoint, **headers: str) -> ws_client.ClientConnection:
    """A stream whose ``Ready`` has been read."""
    ws = await kyutai_client.connect(endpoint.ws_url, endpoint.headers | _header_names(headers))
    await kyutai_client.expect(ws, "Ready")
    return ws


def _header_names(headers: Mapping[str, str]) -> dict[str, str]:
    return {name.replace("_", "-"): value for name, value in headers.items()}


async def session(endpoint: conftest.Endpoint, messages: Iterable[Mapping[str, Any]],
                  marker_id: int = 0, realtime: float | None = None) -> list[dict[str, Any]]:
    """Send ``messages`` while reading; every message up to the marker; a clean close."""
    async with await connect(endpoint) as ws:
        sender = asyncio.create_task(send_all(ws, messages, realtime))
        try:
            return await kyutai_client.until_marker(ws, marker_id, timeout=90)
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)


async def send_all(ws: ws_client.ClientConnection, messages: Iterable[Mapping[str, Any]],
                   realtime: float | None = None) -> None:
    """As ``kyutai_client.send_paced``, with ``OggOpus`` messages sent as they are."""
    started, sent = time.monotonic(), 0.0
    for message in messages:
        await ws.send(kyutai_client.pack(message))
        if realtime and message["type"] == "Audio":
            sent += len(message["pcm"]) / SECOND
            await asyncio.sleep(max(0.0, started + sent / realtime - time.monotonic()))


def chunked(pcm: np.ndarray, size: int) -> list[dict[str, Any]]:
    return [{"type": "Audio", "pcm": pcm[i:i + size]} for i in range(0, len(pcm), size)]


def with_marker(before: list[dict[str, Any]], after_seconds: int = 3,
                marker_id: int = 0) -> list[dict[str, Any]]:
    """``before``, a marker, then 1 s silences so that it comes back (as Kyutai's client)."""
    silence = np.zeros(SECOND, dtype=np.float32)
    return [*before, {"type": "Marker", "id": marker_id},
            *[{"type": "Audio", "pcm": silence}] * after_seconds]


async def close_without_code(ws: ws_client.ClientConnection) -> None:
    """What a browser's ``ws.close()`` sends: a close frame with no status code."""
    ws.transport.write(frames.Frame(frames.Opcode.CLOSE, b"").serialize(mask=True))
    await asyncio.wait_for(ws.wait_closed(), 10)


async def send_then_close(ws: ws_client.ClientConnection, messages: Iterable[bytes]) -> None:
    """``messages`` and a clean close (1000) in one write, so that the server can parse
    the close frame together with audio that it has not read yet."""
    pieces = [frames.Frame(frames.Opcode.BINARY, message).serialize(mask=True)
              for message in messages]
    close = frames.Close(frames.CloseCode.NORMAL_CLOSURE, "").serialize()
    ws.transport.write(b"".join([*pieces, frames.Frame(frames.Opcode.CLOSE, close)
                                 .serialize(mask=True)]))


async def used_slots_become(endpoint: conftest.Endpoint, count: int, within: float) -> float:
    """Seconds until the pod has ``count`` used slots; fails after ``within``."""
    started = time.monotonic()
    while endpoint.used_slots() != count:
        assert time.monotonic() - started < within, f"{endpoint.used_slots()} slots used"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


# Ogg Opus.

def opus_pages(pcm: np.ndarray) -> list[bytes]:
    """``pcm`` (24 kHz) as Ogg Opus pages, as a browser's MediaRecorder would send them."""
    writer = sphn.OpusStreamWriter(SECOND)
    pcm = np.asarray(pcm, dtype=np.float32)
    usable = len(pcm) // FRAME * FRAME
    pages = [bytes(writer.append_pcm(pcm[i:i + FRAME])) for i in range(0, usable, FRAME)]
    return [page for page in pages if page]


def decoded(pieces: Iterable[bytes]) -> list[np.ndarray]:
    """What a fresh streaming reader makes of each piece (the server's own decoding)."""
    reader = sphn.OpusStreamReader(SECOND)
    return [np.asarray(reader.append_bytes(piece), dtype=np.float32) for piece in pieces]


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def opus_messages(pieces: Iterable[bytes]) -> list[dict[str, Any]]:
    return [{"type": "OggOpus", "data": piece} for piece in pieces]


def stereo_opus(workdir: Path) -> bytes:
    t = np.arange(SECOND) / SECOND
    both = np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 660 * t)])
    path = workdir / "stereo.opus"
    sphn.write_opus(str(path), (0.3 * both).astype(np.float32), SECOND)
    return path.read_bytes()
