"""``/v1/realtime?intent=transcription``: OpenAI's Realtime transcription protocol on one of
the pod's slots (:mod:`server.realtime` keeps its state), beside Kyutai's protocol on
the same slots. The key is ``Authorization: Bearer KEY`` (or Kyutai's header or query),
checked as on ``/api/asr-streaming``; a pod behind routers takes their pod token.

A commit pads the stream's last partial frame, marks it, and pushes the model's delay of
silence, so the turn's last words come at once; with server VAD the pod commits each
turn the model's pauses end, from the stream's ``Step`` messages. The client is read
only while the slot has room (backpressure, as for Kyutai's clients), and a client
silent for the idle timeout is told so and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import msgpack
from starlette import responses, websockets

from asrpool.common import protocol, realtime_events
from asrpool.server import budgets, handles, idleness, outcomes, pods, realtime

PATH = realtime_events.PATH
INTENT = realtime_events.INTENT
STEP = msgpack.packb("type") + msgpack.packb("Step")  # a Step, after its map's first byte


async def serve(ws: websockets.WebSocket, pod: pods.Pod) -> None:
    if ws.query_params.get("intent") != INTENT:
        await ws.send_denial_response(responses.PlainTextResponse(
            f"asrpool serves {PATH}?intent={INTENT} only", status_code=400))
        return
    offered = ws.headers.get("sec-websocket-protocol", "")
    refusal = pod.gate.refusal(_with_bearer(ws.headers), ws.query_params,
                               realtime_events.browser_key(offered))
    if refusal is not None:
        pod.count_error(protocol.ErrorCode.UNAUTHORIZED)
        await ws.send_denial_response(responses.PlainTextResponse(refusal, status_code=401))
        return
    await ws.accept(subprotocol=realtime_events.subprotocol(offered))
    session = realtime.Session(
        beta=ws.headers.get(realtime_events.BETA_HEADER, "").startswith("realtime"),
        delay=pod.delay, voice_activity=pod.voice_activity)
    opened = pod.open(resumable=False)
    if isinstance(opened, outcomes.Failed):
        await _end(ws, pod, opened)
        return
    await _run(ws, pod, opened, session)


def _with_bearer(headers: Any) -> dict[str, str]:
    """The request's headers, a Bearer token as Kyutai's key header (one key for both)."""
    out = dict(headers)
    token = realtime_events.bearer_key(headers)
    if token is not None and protocol.API_KEY_HEADER not in out:
        out[protocol.API_KEY_HEADER] = token
    return out


async def _run(ws: websockets.WebSocket, pod: pods.Pod, handle: handles.Handle,
               session: realtime.Session) -> None:
    sending = asyncio.Lock()
    await _send(ws, sending, session.opened())
    outcome: outcomes.Outcome = outcomes.Lost()
    async with handles.connected(handle, False, _read(ws, pod, handle, session, sending),
                                 _write(ws, handle, session, sending)) as tasks:
        reader, kick = tasks.reader, tasks.kick
        if reader.done() and not reader.cancelled() and reader.exception() is None:
            outcome = reader.result()
        elif kick.done():
            outcome = kick.result()
    if isinstance(outcome, outcomes.Failed):
        await _end(ws, pod, outcome)
    handle.finish(outcome)


async def _read(ws: websockets.WebSocket, pod: pods.Pod, handle: handles.Handle,
                session: realtime.Session, sending: asyncio.Lock) -> outcomes.Outcome:
    """The client's events until it leaves or errs, as Kyutai's reader does: idle
    (``idleness``), over its message budget (``budgets``: audio appends are all but
    free, other events cost one each), or a frame the router refused in its place."""
    idle = idleness.IdleWatch(pod.settings.idle_timeout_seconds,
                              lambda: handle.buffered() >= protocol.FRAME_SIZE)
    budget = budgets.MessageBudget(pod.settings.max_messages_per_second,
                                   pod.settings.message_burst)
    try:
        return await _read_events(ws, pod, handle, session, sending, idle, budget)
    except asyncio.CancelledError:
        if idle.expired():
            return outcomes.idle(idle.seconds)
        raise
    finally:
        idle.close()


async def _read_events(ws: websockets.WebSocket, pod: pods.Pod, handle: handles.Handle,
                       session: realtime.Session, sending: asyncio.Lock,
                       idle: idleness.IdleWatch,
                       budget: budgets.MessageBudget) -> outcomes.Outcome:
    while True:
        await handle.room()
        try:
            message = await idle.receive(ws)
        except RuntimeError:  # receive after the connection went away
            return outcomes.Lost()
        if message["type"] == "websocket.disconnect":
            return outcomes.disconnected(int(message.get("code") or protocol.CloseCode.LOST))
        idle.active()
        text = message.get("text")
        if text is None and (told := protocol.decode_router_refusal(message.get("bytes") or b"")):
            return told  # a message the router refused in the client's place (too large)
        said: tuple[list[realtime.Event], list[realtime.Action]] = ([realtime.error(
            "invalid_event", "Expected a text WebSocket message; binary frames are not "
            "supported.")], []) if text is None else session.receive(text)
        samples = sum(len(a.pcm) for a in said[1] if isinstance(a, realtime.Audio))
        if not budget.spend(samples):
            return outcomes.over_budget(pod.settings.max_messages_per_second)
        await _send(ws, sending, _applied(said, handle))


def _applied(said: tuple[list[realtime.Event], list[realtime.Action]],
             handle: handles.Handle) -> list[realtime.Event]:
    """The session's actions done to the stream; the events to send."""
    events, actions = said
    try:
        for action in actions:
            if isinstance(action, realtime.Audio):
                handle.push_audio(action.pcm)
            else:
                handle.push_marker(action.marker_id)
    except protocol.ProtocolError as exc:  # too many turns waiting for their words
        return [*events, realtime.error(str(exc.code), str(exc))]
    return events


async def _write(ws: websockets.WebSocket, handle: handles.Handle, session: realtime.Session,
                 sending: asyncio.Lock) -> None:
    handle.write_through(lambda messages: _unread(session, messages))
    try:
        while True:
            data = await handle.next_output()
            handle.sent()
            if _unread(session, [data]):
                continue
            events = _applied(session.result(msgpack.unpackb(data, raw=False)), handle)
            if events:
                await _send(ws, sending, events)
    finally:
        handle.write_through(None)


def _unread(session: realtime.Session, messages: list[bytes]) -> bool:
    """Whether the stream's messages say nothing to this session: Steps (one per 80 ms)
    without turn detection. They are dropped where the step posts them, before they
    wake the writer."""
    return session.detector is None and all(m.startswith(STEP, 1) for m in messages)


async def _send(ws: websockets.WebSocket, sending: asyncio.Lock,
                events: list[realtime.Event]) -> None:
    async with sending:
        for item in events:
            await ws.send_text(realtime_events.text(item))


async def _end(ws: websockets.WebSocket, pod: pods.Pod, outcome: outcomes.Failed) -> None:
    """The pod's reason as an ``error`` event, then the close, as on Kyutai's path."""
    pod.count_error(outcome.code)
    error = realtime.error(str(outcome.code), outcome.message, kind="server_error")
    with contextlib.suppress(Exception):  # the client may be gone already
        await asyncio.wait_for(_close_with(ws, error, outcome.close_code), 2.0)


async def _close_with(ws: websockets.WebSocket, error: realtime.Event, code: int) -> None:
    await ws.send_text(json.dumps(error))
    await ws.close(code)
