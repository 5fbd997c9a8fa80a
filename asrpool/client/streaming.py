"""A streaming client for the Kyutai STT protocol (server pods and the router alike).

It sends a file as Kyutai's own file client does (silence, 80 ms chunks, silence, a
marker, silence to flush), paced at ``rtf`` times real time, and hands every message
it receives to a callback until the marker comes back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import msgpack
import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

from asrpool.client import errors
from asrpool.common import protocol

MARKER_ID = 0
StreamError = errors.StreamError  # and its kinds: errors.Refused, one per refusal code


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
    """Send ``messages`` paced at ``rtf`` x real time; return what came back.

    A PCM stream whose connection drops (or whose router shuts down) resumes with its
    resume token, up to ``MAX_RESUMES`` times: the server says how many samples it holds
    (``asrpool-resume-offset``), and the audio is sent again from there; it replays the
    messages after the last one received here (``asrpool-resume-received``)."""
    plan = list(messages)
    resumable = not any(m["type"] == "OggOpus" for m in plan)  # pages cannot restart mid-way
    state = _Resume(resumable)
    for attempt in range(MAX_RESUMES + 1):
        if attempt:
            await asyncio.sleep(RESUME_BACKOFF_S * attempt)
        ended = await _connection(url, plan, state, api_key, (rtf, timeout),
                                  (on_message, on_sent))
        if ended is not _DROPPED or state.token is None:
            return StreamResult(state.received, ended is _MARKER)
    return StreamResult(state.received, False)


async def stream_live(
    url: str,
    frames: AsyncIterator[Any],
    *,
    api_key: str | None = None,
    on_message: Callable[[dict[str, Any]], None] = lambda _: None,
    timeout: float = 60.0,
) -> StreamResult:
    """Send audio as it is recorded (``frames``: float samples at 24 kHz, each sent as it
    comes, real time by nature) until the source ends, then a marker and silence until
    the marker is back, so that the last words come. One connection: a live source
    cannot be sent again from where a resumed server stands."""
    received: list[dict[str, Any]] = []
    headers = {protocol.API_KEY_HEADER: api_key} if api_key else {}
    try:
        async with connect(streaming_url(url), additional_headers=headers, max_size=None,
                           open_timeout=timeout) as ws:
            reader = asyncio.create_task(_read_until_marker(ws, received, on_message))
            try:
                async for frame in frames:
                    if reader.done():
                        break
                    await _send_audio(ws, frame)
                await ws.send(packed({"type": "Marker", "id": MARKER_ID}))
                await _flush_until(reader, ws, timeout)
            finally:
                reader.cancel()
            ended = await asyncio.gather(reader, return_exceptions=True)
    except InvalidStatus as exc:
        raise errors.from_status(exc.response.status_code) from exc
    except (OSError, TimeoutError) as exc:
        raise StreamError(f"cannot stream to {url}: {exc}") from exc
    if isinstance(ended[0], BaseException) and not isinstance(ended[0],
                                                              asyncio.CancelledError):
        raise ended[0]
    return StreamResult(received, ended[0] == _MARKER)


def packed(message: dict[str, Any]) -> bytes:
    """One message as Kyutai's clients send it: samples as 32-bit floats (the file and
    the live path alike), bytes (Ogg Opus pages) as msgpack's bin."""
    return bytes(msgpack.packb(message, use_bin_type=True, use_single_float=True))


async def _send_audio(ws: Any, pcm: Any) -> None:
    samples = np.asarray(pcm, dtype=np.float32)
    await ws.send(packed({"type": "Audio", "pcm": samples.tolist()}))


async def _flush_until(reader: asyncio.Task[str], ws: Any, timeout: float) -> None:
    """Silence at real time until the reader has the marker (the model's delay), at
    most ``timeout`` seconds."""
    silence = np.zeros(protocol.FRAME_SIZE, dtype=np.float32)
    frame_seconds = protocol.FRAME_SIZE / protocol.SAMPLE_RATE
    for _ in range(int(timeout / frame_seconds)):
        if reader.done():
            return
        try:
            await _send_audio(ws, silence)
        except ConnectionClosed:
            return
        await asyncio.wait({reader}, timeout=frame_seconds)


MAX_RESUMES = 5
RESUME_BACKOFF_S = 0.2  # times the attempt: a router replaced, a network back
_MARKER, _CLOSED, _DROPPED = "marker", "closed", "dropped"
RESUMABLE_CLOSES = frozenset({protocol.CloseCode.NO_STATUS, protocol.CloseCode.LOST,
                              protocol.CloseCode.RESTART, 1001})


@dataclasses.dataclass
class _Resume:
    """What a resume needs: the token, what was received and sent so far."""

    resumable: bool
    token: str | None = None
    received: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sent_samples: int = 0  # the furthest sent, for progress counted once

    def headers(self, api_key: str | None) -> dict[str, str]:
        headers = {protocol.API_KEY_HEADER: api_key} if api_key else {}
        if self.resumable:
            headers[protocol.RESUMABLE_HEADER] = "1"
        if self.token is not None:
            headers[protocol.RESUME_TOKEN_HEADER] = self.token
            got = sum(m.get("type") != "Ready" for m in self.received)
            headers[protocol.RESUME_RECEIVED_HEADER] = str(got)
        return headers


async def _connection(url: str, plan: list[dict[str, Any]], state: _Resume,
                      api_key: str | None, pace: tuple[float, float],
                      callbacks: tuple[Callable[[dict[str, Any]], None],
                                       Callable[[int], None]]) -> str:
    """One connection of the stream: how it ended (marker, closed, dropped)."""
    rtf, timeout = pace
    on_message, on_sent = callbacks
    resuming = state.token is not None
    try:
        async with connect(streaming_url(url), additional_headers=state.headers(api_key),
                           max_size=None, open_timeout=timeout) as ws:
            headers = ws.response.headers if ws.response is not None else {}
            if state.resumable:
                state.token = headers.get(protocol.RESUME_TOKEN_HEADER) or state.token
            held = _held(headers.get(protocol.RESUME_OFFSET_HEADER)) if resuming else 0

            def sent(samples: int, upto: int) -> None:
                if upto > state.sent_samples:
                    on_sent(upto - state.sent_samples)
                    state.sent_samples = upto

            reader = asyncio.create_task(_read_until_marker(ws, state.received, on_message))
            writer = asyncio.create_task(_send_paced(ws, from_sample(plan, held), rtf,
                                                     held, sent))
            done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            if reader not in done:
                await _await_marker(reader, timeout)
            writer.cancel()
            return reader.result()
    except InvalidStatus as exc:
        raise errors.from_status(exc.response.status_code) from exc
    except InvalidURI as exc:
        raise StreamError(f"not a websocket URL: {url}") from exc
    except (OSError, TimeoutError) as exc:
        if resuming:  # the platform changing under the stream: try again
            return _DROPPED
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise StreamError(f"cannot connect to {url}: {reason}") from exc


def _held(offset: str | None) -> int:
    """The samples a resumed server says it holds (all of them resent when it says no
    number: a word may then come twice, none is lost)."""
    return int(offset) if offset is not None and offset.isdigit() else 0


def from_sample(plan: list[dict[str, Any]], held: int) -> Iterator[dict[str, Any]]:
    """The stream's messages from its ``held``-th sample on (what a resumed server does
    not have yet): audio before it dropped, the message across it cut, and a message
    between audio (a marker) kept only where it comes at or after that sample."""
    at = 0
    for message in plan:
        if message["type"] != "Audio":
            if at >= held:
                yield message
            continue
        pcm = message["pcm"]
        end = at + len(pcm)
        if end > held:
            yield {**message, "pcm": pcm[max(0, held - at):]}
        at = end


async def _await_marker(reader: asyncio.Task[str], timeout: float) -> None:
    """All audio is sent; the marker must follow within ``timeout`` seconds."""
    done, _ = await asyncio.wait({reader}, timeout=timeout)
    if not done:
        reader.cancel()
        raise StreamError(f"no transcript end (marker) {timeout:g} s after the audio ended")


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
                      start_sample: int, on_sent: Callable[[int, int], None]) -> None:
    """Send, paced; ``on_sent(samples, upto)`` after each message of audio (``upto``: the
    stream's samples sent by then, counted from the start of the stream)."""
    start, sent_seconds, upto = time.monotonic(), 0.0, start_sample
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
            upto += samples
            on_sent(samples, upto)
        try:
            await ws.send(packed(body))
        except ConnectionClosed:
            return
        ahead = sent_seconds / rtf - (time.monotonic() - start)
        if ahead > 0:
            await asyncio.sleep(ahead)


async def _read_until_marker(ws: Any, received: list[dict[str, Any]],
                             on_message: Callable[[dict[str, Any]], None]) -> str:
    """Every message until the marker (``_MARKER``), a close (``_CLOSED``) or a drop the
    stream may resume after (``_DROPPED``: a lost connection, a server shutting down)."""
    draining = False
    try:
        async for frame in ws:
            if isinstance(frame, str):
                continue
            message = msgpack.unpackb(frame, raw=False)
            if message.get("type") == "Error" and message.get("code") == "draining":
                draining = True  # its close follows: resume elsewhere
                continue
            if message.get("type") == "Ready" and received:
                continue  # a resumed connection's
            received.append(message)
            on_message(message)
            if message.get("type") == "Error":
                raise errors.from_error(message)
            if message.get("type") == "Marker" and message.get("id") == MARKER_ID:
                return _MARKER
    except ConnectionClosed:
        pass
    code = ws.close_code if ws.close_code is not None else protocol.CloseCode.LOST
    return _DROPPED if draining or code in RESUMABLE_CLOSES else _CLOSED
