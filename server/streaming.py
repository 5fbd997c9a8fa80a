"""The websocket handler of ``/api/asr-streaming``: moves bytes, never touches the model.

One connection runs a reader (client messages into the slot's buffer, paused while
the buffer is full: backpressure) and a writer (the stream's outbox to the client)
until the client leaves, misbehaves, goes silent, or the pod ends the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette import responses, websockets
from starlette.types import Message

from asrpool.common import protocol
from asrpool.server import pods, sessions, slots

logger = logging.getLogger(__name__)

# Resume extension headers (beside protocol.RESUME_TOKEN_HEADER): the response says how
# many samples of the stream the pod has received, so the client resends the rest; the
# request says how many messages (after Ready) the client has received, so the pod
# replays what the dropped connection lost.
# Close codes after which the client may come back: the connection was lost, not closed.
_LOST = {1005, 1006}
_FLUSH_SECONDS = 2.0


async def serve(ws: websockets.WebSocket, pod: pods.Pod) -> None:
    refusal = pod.refusal(ws.headers, ws.query_params)
    if refusal is not None:
        pod.metrics.errors.labels("unauthorized").inc()
        await ws.send_denial_response(responses.PlainTextResponse(refusal, status_code=401))
        return
    token = ws.headers.get(protocol.RESUME_TOKEN_HEADER)
    stream, outcome = await _claim(pod, token)
    if stream is None:
        assert outcome is not None
        await _refuse(ws, pod, outcome)
        return
    received = ws.headers.get(protocol.RESUME_RECEIVED_HEADER, "")
    if token:
        replayed = stream.replay_from(int(received)) if received.isdigit() else 0
        logger.info("stream %s resumed: %d messages replayed, %d waiting", stream.session_id,
                    replayed, len(stream.outbox))
    try:
        await ws.accept(headers=[
            (protocol.SESSION_ID_HEADER.encode(), stream.session_id.encode()),
            (protocol.RESUME_TOKEN_HEADER.encode(), stream.resume_token.encode()),
            (protocol.RESUME_OFFSET_HEADER.encode(),
             str(pod.buffers.received(stream.slot)).encode()),
        ])
    except OSError:  # the client left during the handshake: only a resumed stream waits
        pod.sessions.finish(stream, sessions.Outcome("dropped" if token else "clean"))
        return
    pod.metrics.connect.inc()
    if token:
        pod.metrics.resumes.inc()
    await _attached(ws, pod, stream)


async def _claim(pod: pods.Pod, token: str | None
                 ) -> tuple[sessions.Stream | None, sessions.Outcome | None]:
    if token:
        stream = await pod.sessions.reclaim(token)
        if stream is None:
            return None, sessions.Outcome.failure(
                "unknown or expired resume token", "bad_resume_token")
        return stream, None
    refused = pod.not_accepting()
    if refused is not None:
        return None, refused
    stream = pod.sessions.open()
    if stream is None:
        return None, sessions.Outcome.failure(protocol.BUSY_MESSAGE, "busy", 1013)
    return stream, None


async def _refuse(ws: websockets.WebSocket, pod: pods.Pod, outcome: sessions.Outcome) -> None:
    with contextlib.suppress(OSError):  # the client may have left already
        await ws.accept()
        await _close(ws, pod, [], outcome)


async def _attached(ws: websockets.WebSocket, pod: pods.Pod, stream: sessions.Stream) -> None:
    kick = pod.sessions.attach(stream)
    pod.metrics.open_channels.inc()
    reader = asyncio.create_task(_read(ws, pod, stream))
    writer = asyncio.create_task(_write(ws, stream))
    try:
        await asyncio.wait({reader, writer, kick}, return_when=asyncio.FIRST_COMPLETED)
        if reader.done():
            outcome = reader.result()
        elif kick.done():
            outcome = kick.result()
        else:  # the writer failed: the connection is gone
            outcome = sessions.Outcome("dropped")
    finally:
        pod.metrics.open_channels.dec()
        for task in (reader, writer):
            task.cancel()
        await asyncio.gather(reader, writer, return_exceptions=True)
    if outcome.kind == "error":
        pending = list(stream.outbox)
        stream.outbox.clear()
        await _close(ws, pod, pending, outcome)
    elif outcome.kind == "replaced":  # the new connection takes the outbox
        await _close(ws, pod, [], outcome)
    pod.sessions.finish(stream, outcome)


async def _close(ws: websockets.WebSocket, pod: pods.Pod, pending: list[bytes],
                 outcome: sessions.Outcome) -> None:
    """Send what is left, then the Error, then close; a vanished client is no error."""
    if outcome.code is not None:
        pod.metrics.errors.labels(outcome.code).inc()
    messages = [*pending, *([outcome.message] if outcome.message else [])]
    with contextlib.suppress(Exception):  # the client may be gone, or stuck: never wait long
        await asyncio.wait_for(_send_and_close(ws, messages, outcome.close_code),
                               _FLUSH_SECONDS)


async def _send_and_close(ws: websockets.WebSocket, messages: list[bytes],
                          close_code: int) -> None:
    for message in messages:
        await ws.send_bytes(message)
    await ws.close(close_code)


async def _read(ws: websockets.WebSocket, pod: pods.Pod, stream: sessions.Stream
                ) -> sessions.Outcome:
    config = pod.settings
    while True:
        await _room(pod, stream)
        try:
            message = await _receive(ws, pod, stream)
        except asyncio.TimeoutError:
            return sessions.Outcome.failure(
                f"no message for {config.idle_timeout_seconds:g} s", "idle_timeout", 1000)
        except RuntimeError:  # receive after the connection went away
            return sessions.Outcome("dropped")
        if message["type"] == "websocket.disconnect":
            lost = message.get("code", 1005) in _LOST
            return sessions.Outcome("dropped" if lost else "clean")
        data = message.get("bytes")
        if data is None:
            continue  # text frames are ignored, as in moshi-server
        try:
            body = protocol.decode_client(data, config.max_message_bytes)
        except protocol.ProtocolError as exc:
            close_code = 1009 if exc.code == "too_large" else 1008
            return sessions.Outcome.failure(str(exc), exc.code, close_code)
        _apply(pod, stream, body)


async def _receive(ws: websockets.WebSocket, pod: pods.Pod,
                   stream: sessions.Stream) -> Message:
    """The next message; a client is idle only while the engine has nothing of it left."""
    receiving = asyncio.ensure_future(ws.receive())
    try:
        while True:
            done, _ = await asyncio.wait({receiving}, timeout=pod.settings.idle_timeout_seconds)
            if done:
                return receiving.result()
            if pod.buffers.buffered(stream.slot) < slots.FRAME_SIZE:
                raise asyncio.TimeoutError
    finally:
        receiving.cancel()


def _apply(pod: pods.Pod, stream: sessions.Stream, body: protocol.ClientMessage) -> None:
    if body["type"] == "Audio":
        pod.buffers.push_audio(stream.slot, body["pcm"])
    elif body["type"] == "Marker":
        pod.buffers.push_marker(stream.slot, body["id"])
    else:
        pod.sessions.restart(stream)


async def _room(pod: pods.Pod, stream: sessions.Stream) -> None:
    """Backpressure: wait (not reading the socket) while the slot's buffer is full."""
    cap = pod.settings.max_buffer_samples
    while pod.buffers.buffered(stream.slot) >= cap:
        stream.room.clear()
        if pod.buffers.buffered(stream.slot) >= cap:
            await stream.room.wait()


async def _write(ws: websockets.WebSocket, stream: sessions.Stream) -> None:
    await ws.send_bytes(protocol.ready())
    while True:
        await stream.has_output.wait()
        stream.has_output.clear()
        while stream.outbox:
            await ws.send_bytes(stream.outbox[0])
            stream.mark_sent()
