"""A streaming client for the Kyutai STT protocol (server pods and the router alike).

It sends a file as Kyutai's own file client does (silence, 80 ms chunks, silence, a
marker, silence to flush), paced at ``rtf`` times real time, and hands every message
it receives to a callback until the marker comes back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgpack
import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

from asrpool.common import protocol

MARKER_ID = 0


class StreamError(RuntimeError):
    """The stream could not run or was cut; the message says why, in one line."""


@dataclasses.dataclass
class StreamResult:
    messages: list[dict[str, Any]]
    marker_seen: bool

    @property
    def words(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("type") in ("Word", "EndWord")]


def streaming_url(url: str) -> str:
    """Accept a base URL (ws://host:port) or the full streaming route."""
    base = url.rstrip("/")
    if base.startswith("http"):
        base = "ws" + base.removeprefix("http")
    return base if protocol.STREAMING_PATH in base else base + protocol.STREAMING_PATH


async def stream_messages(
    url: str,
    messages: Iterable[dict[str, Any]],
    *,
    rtf: float = 1.0,
    api_key: str | None = None,
    on_message: Callable[[dict[str, Any]], None] = lambda _: None,
    on_sent: Callable[[int], None] = lambda _: None,
    timeout: float = 60.0,
) -> StreamResult:
    """Send ``messages`` paced at ``rtf`` x real time; return what came back."""
    headers = {protocol.API_KEY_HEADER: api_key} if api_key else {}
    try:
        async with connect(streaming_url(url), additional_headers=headers, max_size=None,
                           open_timeout=timeout) as ws:
            received: list[dict[str, Any]] = []
            reader = asyncio.create_task(_read_until_marker(ws, received, on_message))
            writer = asyncio.create_task(_send_paced(ws, messages, rtf, on_sent))
            done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            if reader not in done:
                await _await_marker(reader, timeout)
            writer.cancel()
            return StreamResult(received, reader.result())
    except InvalidStatus as exc:
        raise StreamError(_status_message(exc.response.status_code)) from exc
    except InvalidURI as exc:
        raise StreamError(f"not a websocket URL: {url}") from exc
    except (OSError, TimeoutError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise StreamError(f"cannot connect to {url}: {reason}") from exc


async def _await_marker(reader: asyncio.Task[bool], timeout: float) -> None:
    """All audio is sent; the marker must follow within ``timeout`` seconds."""
    done, _ = await asyncio.wait({reader}, timeout=timeout)
    if not done:
        reader.cancel()
        raise StreamError(f"no transcript end (marker) {timeout:g} s after the audio ended")


def _status_message(status: int) -> str:
    if status == 401:
        return "authentication failed (HTTP 401): check --api-key"
    return f"the server refused the websocket upgrade (HTTP {status})"


def as_opus(messages: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The same stream with its audio as one Ogg Opus stream: each ``Audio`` message
    becomes an ``OggOpus`` message of the pages its samples completed (the encoder
    holds back what does not yet fill a page: audio before a marker may follow it by a
    page, as from any Opus sender). Each carries ``samples``, the audio it stands for,
    which pacing counts and the sender drops."""
    import sphn

    writer = sphn.OpusStreamWriter(protocol.SAMPLE_RATE)
    samples = 0
    for message in messages:
        if message["type"] != "Audio":
            yield message
            continue
        pcm = np.asarray(message["pcm"], dtype=np.float32)
        samples += len(pcm)
        data = bytes(writer.append_pcm(pcm))
        if data:
            yield {"type": "OggOpus", "data": data, "samples": samples}
            samples = 0


async def _send_paced(ws: Any, messages: Iterable[dict[str, Any]], rtf: float,
                      on_sent: Callable[[int], None]) -> None:
    start, sent_seconds = time.monotonic(), 0.0
    for message in messages:
        body = dict(message)
        samples = 0
        if body["type"] == "Audio":
            pcm = np.asarray(body["pcm"], dtype=np.float32)
            body["pcm"] = pcm.tolist()
            samples = len(pcm)
        elif body["type"] == "OggOpus":
            samples = body.pop("samples", 0)
        if samples:
            sent_seconds += samples / protocol.SAMPLE_RATE
            on_sent(samples)
        try:
            await ws.send(msgpack.packb(body, use_bin_type=True))
        except ConnectionClosed:
            return
        ahead = sent_seconds / rtf - (time.monotonic() - start)
        if ahead > 0:
            await asyncio.sleep(ahead)


async def _read_until_marker(ws: Any, received: list[dict[str, Any]],
                             on_message: Callable[[dict[str, Any]], None]) -> bool:
    try:
        async for frame in ws:
            if isinstance(frame, str):
                continue
            message = msgpack.unpackb(frame, raw=False)
            received.append(message)
            on_message(message)
            if message.get("type") == "Error":
                raise StreamError(f"server error: {message.get('message')}")
            if message.get("type") == "Marker" and message.get("id") == MARKER_ID:
                return True
    except ConnectionClosed:
        pass
    return False
