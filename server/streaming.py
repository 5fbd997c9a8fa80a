"""The websocket handler of ``/api/asr-streaming``: moves bytes, never touches the model.

One connection runs a reader (client messages into its stream's :class:`handles.Handle`,
paused while the buffer is full: backpressure) and a writer (the stream's output to the
client) until the client leaves, misbehaves, goes idle, or the pod ends the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from starlette import responses, websockets

from asrpool.common import framing, protocol
from asrpool.server import budgets, handles, idleness, intake, outcomes, pods

logger = logging.getLogger(__name__)

_FLUSH_SECONDS = 2.0


async def serve(ws: websockets.WebSocket, pod: pods.Pod) -> None:
    refusal = pod.gate.refusal(ws.headers, ws.query_params)
    if refusal is not None:
        pod.count_error(protocol.ErrorCode.UNAUTHORIZED)
        await ws.send_denial_response(responses.PlainTextResponse(refusal, status_code=401))
        return
    token = ws.headers.get(protocol.RESUME_TOKEN_HEADER)
    received = protocol.resume_received(ws.headers)
    if isinstance(received, protocol.ProtocolError):  # before the stream is touched
        pod.count_error(received.code)
        await ws.send_denial_response(responses.PlainTextResponse(str(received), 400))
        return
    claimed = await pod.reclaim(token) if token else pod.open(protocol.resumable(ws.headers))
    if isinstance(claimed, outcomes.Failed):
        await _refuse(ws, pod, claimed)
        return
    try:
        if token:
            _replay(claimed, received)
        await ws.accept(headers=[
            (protocol.SESSION_ID_HEADER.encode(), claimed.session_id.encode()),
            (protocol.RESUME_TOKEN_HEADER.encode(), claimed.resume_token.encode()),
            (protocol.RESUME_OFFSET_HEADER.encode(), str(claimed.received()).encode()),
        ])
    except OSError:  # the client left during the handshake: only a resumed stream waits
        claimed.finish(outcomes.Lost())
        return
    except BaseException:  # never leave a claimed slot behind (cancelled, a bug)
        claimed.finish(outcomes.Lost())
        raise
    if pod.intake is not None:
        await _attached_elsewhere(ws, pod, pod.intake, claimed, resumed=bool(token))
    else:
        await _attached(ws, pod, claimed, resumed=bool(token))


def _replay(handle: handles.Handle, received: int | None) -> None:
    replayed = 0 if received is None else handle.replay_from(received)
    logger.info("stream %s resumed: %d messages replayed, %d waiting", handle.session_id,
                replayed, handle.waiting())


async def _refuse(ws: websockets.WebSocket, pod: pods.Pod, outcome: outcomes.Failed) -> None:
    with contextlib.suppress(OSError):  # the client may have left already
        await ws.accept()
        await _close(ws, pod, [], outcome)


async def _attached(ws: websockets.WebSocket, pod: pods.Pod, handle: handles.Handle,
                    resumed: bool) -> None:
    outcome: outcomes.Outcome
    async with handles.connected(handle, resumed, _read(ws, pod, handle),
                                 _write(ws, handle)) as tasks:
        reader, writer, kick = tasks.reader, tasks.writer, tasks.kick
        if reader.done():
            outcome = reader.result()
            if isinstance(outcome, outcomes.Failed) and outcome.code in outcomes.CLIENT_FAULTS:
                await _results_of_received(handle, kick, writer)
        elif kick.done():
            outcome = kick.result()
            if isinstance(outcome, outcomes.Failed) and outcome.code in outcomes.CLIENT_FAULTS:
                # An Opus lane could not decode the stream's bytes: no more are read, and
                # the results of the audio before them go out first, as for a bad message.
                reader.cancel()
                await _results_of_received(handle, asyncio.get_running_loop().create_future(),
                                           writer)
        else:  # the writer failed: the connection is gone, closed by the client or lost
            outcome = _ended(ws)
        if isinstance(outcome, outcomes.Lost) and framing.send_timed_out(ws.scope):
            outcome = outcomes.too_slow(pod.settings.send_timeout_seconds)
    if isinstance(outcome, outcomes.Failed):
        await _close(ws, pod, handle.take_pending(), outcome)
    elif isinstance(outcome, outcomes.Replaced):  # the new connection takes the outbox
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(protocol.CloseCode.NORMAL), _FLUSH_SECONDS)
    handle.finish(outcome)


async def _attached_elsewhere(ws: websockets.WebSocket, pod: pods.Pod,
                              workers: intake.IntakeWorkers, handle: handles.Handle,
                              resumed: bool) -> None:
    """The stream's messages in an intake process: the connection is handed over, and
    this task waits for the stream's end, from the client's side or the pod's, and ends
    it as :func:`_attached` does."""
    connection = framing.connection_of(ws.scope)
    try:
        if connection is None:
            raise framing.EarlyFrames("no connection to hand over")
        remote = workers.hand_over(connection, handle)
    except framing.EarlyFrames:  # read by uvicorn already: the stream stays here
        await _attached(ws, pod, handle, resumed)
        return
    kick = handle.attach(resumed)
    reader = asyncio.create_task(remote.read())
    try:
        outcome = await _until_ended(handle, kick, reader, remote.closed)
    finally:
        handle.detach()
        handle.write_through(None)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    try:
        if isinstance(outcome, outcomes.Failed):
            pod.count_error(outcome.code)
            await remote.end([*handle.take_pending(), outcome.frame()], outcome.close_code)
        else:  # the client left, or a resume took over (its new connection has the outbox)
            await remote.end([], remote.close_code)
    finally:
        workers.done(remote)
        handle.finish(outcome)


async def _until_ended(handle: handles.Handle, kick: asyncio.Future[outcomes.Outcome],
                       reader: asyncio.Task[outcomes.Outcome],
                       closed: asyncio.Future[None]) -> outcomes.Outcome:
    """The outcome of the first of the reader and the pod's kick; a client's fault ends
    the stream once the results of its audio before are out."""
    waited: set[asyncio.Future[Any]] = {reader, kick}
    await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
    outcome = reader.result() if reader.done() else kick.result()
    if isinstance(outcome, outcomes.Failed) and outcome.code in outcomes.CLIENT_FAULTS:
        if not reader.done():
            reader.cancel()
        await _results_of_received(handle, kick if not kick.done() else
                                   asyncio.get_running_loop().create_future(), closed)
    return outcome


async def _results_of_received(handle: handles.Handle, kick: asyncio.Future[outcomes.Outcome],
                               writer: asyncio.Future[Any]) -> None:
    """A bad message ends its stream, but, as on moshi-server, only once the results of
    the audio received before it are out: the engine steps what is buffered while the
    writer keeps sending. Bounded by that audio's length and a margin; the pod ending
    the stream, or the writer failing, ends the wait."""
    seconds = handle.buffered() / protocol.SAMPLE_RATE + _FLUSH_SECONDS
    processed = asyncio.ensure_future(handle.all_processed())
    try:
        waited: set[asyncio.Future[Any]] = {processed, kick, writer}
        await asyncio.wait(waited, timeout=seconds,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        processed.cancel()


async def _close(ws: websockets.WebSocket, pod: pods.Pod, pending: list[bytes],
                 outcome: outcomes.Failed) -> None:
    """Send what is left, then the Error, then close; a vanished client is no error."""
    pod.count_error(outcome.code)
    with contextlib.suppress(Exception):  # the client may be gone, or stuck: never wait long
        await asyncio.wait_for(
            _send_and_close(ws, [*pending, outcome.frame()], outcome.close_code),
            _FLUSH_SECONDS)


async def _send_and_close(ws: websockets.WebSocket, messages: list[bytes],
                          close_code: int) -> None:
    for message in messages:
        await ws.send_bytes(message)
    await ws.close(close_code)


async def _read(ws: websockets.WebSocket, pod: pods.Pod,
                handle: handles.Handle) -> outcomes.Outcome:
    idle = idleness.IdleWatch(pod.settings.idle_timeout_seconds,
                              lambda: handle.buffered() >= protocol.FRAME_SIZE)
    budget = budgets.MessageBudget(pod.settings.max_messages_per_second,
                                   pod.settings.message_burst)
    connection = framing.connection_of(ws.scope)
    if connection is not None:
        connection.fast_reader = _fast_reader(pod, handle, idle, budget)
    try:
        return await _read_messages(ws, pod, handle, idle, budget)
    except asyncio.CancelledError:
        if idle.expired():
            return outcomes.idle(idle.seconds)
        raise
    finally:
        if connection is not None:
            connection.fast_reader = None
        idle.close()


def _fast_reader(pod: pods.Pod, handle: handles.Handle, idle: idleness.IdleWatch,
                 budget: budgets.MessageBudget) -> Callable[[bytes], bool]:
    """Takes a binary message in the protocol's own callback, as the reader would, when
    that is all there is to it: the reader waits with nothing queued before it, the
    message is good ``Audio`` within budget, and the slot has room. No ASGI event is
    made and no task woken. Anything else (another kind, a fault, a full slot) is left
    to the reader, which decodes it again and answers as ever."""
    max_bytes = pod.settings.max_message_bytes

    def take(data: bytes) -> bool:
        if not idle.waiting:
            return False
        try:
            decoded = protocol.decode_client(data, max_bytes)
        except protocol.ProtocolError:
            return False
        if decoded["type"] != "Audio" or not handle.takes_audio_now():
            return False
        if not budget.spend(len(decoded["pcm"])):
            return False  # the reader spends again, and ends the stream over budget
        handle.push_audio_now(decoded)
        idle.active()
        return True

    return take


async def _read_messages(ws: websockets.WebSocket, pod: pods.Pod, handle: handles.Handle,
                         idle: idleness.IdleWatch,
                         budget: budgets.MessageBudget) -> outcomes.Outcome:
    """Until the client leaves or errs; ``idle`` cancels it when the client goes idle."""
    while True:
        await handle.room()
        try:
            message = await idle.receive(ws)
        except RuntimeError:  # receive after the connection went away
            return outcomes.Lost()
        if message["type"] == "websocket.disconnect":
            return outcomes.disconnected(int(message.get("code") or protocol.CloseCode.NO_STATUS))
        refused = framing.refused(message)  # a frame over the limit, refused from its header
        if refused is not None:
            return refused
        data = message.get("bytes")
        if data is None:  # text frames are ignored, and are no activity, as in moshi-server
            if not budget.spend(0):
                return outcomes.over_budget(pod.settings.max_messages_per_second)
            continue
        idle.active()
        try:
            decoded = protocol.decode_client(data, pod.settings.max_message_bytes)
            if not budget.spend(budgets.samples_of(decoded)):
                return outcomes.over_budget(pod.settings.max_messages_per_second)
            await handle.room()  # the fast reader may have filled it while this one waited
            await handle.push(decoded)
            idle.active()  # a push held back for room was no idleness
        except protocol.ProtocolError as exc:
            return outcomes.refused_message(exc, data)


def _ended(ws: websockets.WebSocket) -> outcomes.Outcome:
    """A connection gone before the reader saw its end: a clean close if the client sent
    one (parsed, with the connection's end, behind audio the pod still holds back)."""
    code = framing.close_received(ws.scope)
    return outcomes.Lost() if code is None else outcomes.disconnected(code)


async def _write(ws: websockets.WebSocket, handle: handles.Handle) -> None:
    await ws.send_bytes(protocol.ready())
    connection = framing.connection_of(ws.scope)
    if connection is not None:  # results are sent as the step's callback posts them
        handle.write_through(connection.send_now)
    try:
        while True:  # what could not be sent at once (the client reads slowly), in order
            await ws.send_bytes(await handle.next_output())
            handle.sent()
    finally:
        handle.write_through(None)
