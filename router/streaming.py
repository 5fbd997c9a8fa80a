"""One client stream through the router, from upgrade to close.

Order: authenticate (a bad key is HTTP 401 before the upgrade, as Kyutai's server
does); place the stream (or resume it) on a pod that answered ``Ready``; accept,
handing the session id, resume token and the pod's resume offset in the 101's
headers; relay bytes (the pod's ``Ready`` first); end both sides as the way it ended
requires.
Refusals are an upgrade, an ``Error`` and a close, as the pod's own busy answer is;
a client over its new streams per second (per address from the request head, per API
key here) gets HTTP 429 before any of this (``router.throttling``). A client of
OpenAI's Realtime API takes the same path in its own protocol (``router.dialects``):
its refusals are ``error`` events, its key may come as ``Authorization: Bearer``, and
its session neither resumes nor moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable

import redis
from starlette import requests, responses
from starlette import websockets as starlette_ws

from asrpool.common import auth, framing, protocol, rates, realtime_events
from asrpool.router import (
    admissions,
    dialects,
    frames,
    moving,
    placing,
    pods,
    poolnames,
    proxying,
    refusals,
    relaying,
    tokens,
    wiring,
)

log = logging.getLogger(__name__)

ANONYMOUS = auth.ApiKey(id="", sha256="")
FORBIDDEN_POOL = "forbidden_pool"  # rejections{reason}: a key used on a pool it may not use


def unauthorized(deps: wiring.Deps) -> responses.Response:
    """The answer to a missing or unknown API key (stream, upload or view), counted."""
    deps.meters.rejections.labels(protocol.ErrorCode.UNAUTHORIZED).inc()
    return responses.PlainTextResponse(protocol.UNAUTHORIZED, status_code=401)


def authenticate(ws: requests.HTTPConnection, keyring: auth.KeyRing | None,
                 bearer: bool = False) -> auth.ApiKey | None:
    """The client's key: Kyutai's header or query parameter, or (``bearer``: OpenAI's
    clients) ``Authorization: Bearer KEY`` or a browser's subprotocol key."""
    if keyring is None:
        return ANONYMOUS
    plain = ws.headers.get(protocol.API_KEY_HEADER) or ws.query_params.get(protocol.API_KEY_QUERY)
    if plain is None and bearer:
        plain = realtime_events.bearer_key(ws.headers)
        if plain is None:  # a browser's, which only a key that allows browsers may be
            return keyring.find_browsers(realtime_events.browser_key(
                ws.headers.get("sec-websocket-protocol", "")))
    return keyring.find(plain)


async def serve(ws: starlette_ws.WebSocket, pool: str | None, deps: wiring.Deps,
                dialect: dialects.Dialect = dialects.KYUTAI) -> None:
    if deps.draining:  # router.draining: another router takes it
        await refuse(ws, refusals.router_draining(), deps, dialect)
        return
    resume_text = resume_fields(ws).get(protocol.RESUME_TOKEN_HEADER) \
        if dialect.keeps_streams else None
    key = authenticate(ws, deps.keyring, bearer=not dialect.keeps_streams)
    if key is None:
        await ws.send_denial_response(unauthorized(deps))
        return
    throttled = deps.new_streams.of_key(key.id) if resume_text is None else None
    if throttled is not None:  # its address was checked from the request head already
        await throttle(ws, throttled)
        return
    conn = uuid.uuid4().hex
    if resume_text is not None:
        await _resume(ws, resume_text, key, conn, deps)
    else:
        await _start(ws, pool or deps.config.default_pool, key, conn, deps, dialect)


async def serve_realtime(ws: starlette_ws.WebSocket, pool: str | None,
                         deps: wiring.Deps) -> None:
    """OpenAI's Realtime API: transcription sessions only (``?intent=transcription``)."""
    if ws.query_params.get("intent") != realtime_events.INTENT:
        deps.meters.rejections.labels("protocol_error").inc()
        await ws.send_denial_response(responses.PlainTextResponse(
            f"asrpool serves {realtime_events.PATH}?intent={realtime_events.INTENT} only",
            status_code=400))
        return
    await serve(ws, pool, deps, dialects.realtime(ws.headers))


async def forbid(ws: starlette_ws.WebSocket, message: str, deps: wiring.Deps) -> None:
    """HTTP 403 before the upgrade: a key used on a pool it may not use. Nothing is
    written to Redis: no demand for that pool."""
    deps.meters.rejections.labels(FORBIDDEN_POOL).inc()
    await ws.send_denial_response(responses.PlainTextResponse(message, status_code=403))


async def throttle(ws: starlette_ws.WebSocket, throttled: rates.Throttled) -> None:
    """HTTP 429 before the upgrade; nothing is written to Redis (no demand for the pool)."""
    await ws.send_denial_response(responses.PlainTextResponse(
        throttled.message, throttled.status, throttled.headers))


def resume_fields(ws: requests.HTTPConnection) -> dict[str, str]:
    """The resume fields a client sent: as headers, or as query parameters of the same
    names (browsers, which cannot set a websocket's headers)."""
    out = {}
    for name in protocol.RESUME_FIELDS:
        value = ws.headers.get(name) or ws.query_params.get(name)
        if value is not None:
            out[name] = value
    return out


def _in_band(ws: requests.HTTPConnection, token: tokens.ResumeToken,
             offset: int | None) -> bytes | None:
    """For a client that asked for a resume in its query (a browser, which cannot read
    the 101's headers): its token and offset, sent right after the ``Ready``."""
    if not any(name in ws.query_params for name in protocol.RESUME_FIELDS):
        return None
    return protocol.encode({"type": protocol.RESUMABLE_MESSAGE, "token": token.text,
                            "session_id": token.session_id, "offset": offset or 0})


def _extension_headers(token: tokens.ResumeToken, resume_offset: int | None
                       ) -> list[tuple[bytes, bytes]]:
    out = [
        (protocol.SESSION_ID_HEADER, token.session_id),
        (protocol.RESUME_TOKEN_HEADER, token.text),
    ]
    if resume_offset is not None:
        out.append((protocol.RESUME_OFFSET_HEADER, str(resume_offset)))
    return [(name.encode(), value.encode()) for name, value in out]


def _resume_offset(session: admissions.Session, opened: pods.Opened) -> int | None:
    """The samples of the stream the client need not send again: its pod's, and those
    of the pods it was on before (a moved stream's); None for a new stream."""
    if not (opened.resume_offset.isascii() and opened.resume_offset.isdigit()):
        return None
    return session.earlier.samples + int(opened.resume_offset)


async def _start(
    ws: starlette_ws.WebSocket, pool: str, key: auth.ApiKey, conn: str, deps: wiring.Deps,
    dialect: dialects.Dialect,
) -> None:
    asked, resolved = pool, poolnames.resolve(pool, deps.config.pool_namespace)
    if resolved is None:
        await refuse(ws, refusals.unknown_pool(asked), deps, dialect)
        return
    pool = resolved
    if not key.allows(pool):
        await forbid(ws, key.refusal(pool), deps)
        return
    token = tokens.mint(pool, tokens.new_session_id())
    request = admissions.Request(pool, key.id, key.max_streams or 0, token, conn)
    started = time.perf_counter()
    gone = asyncio.Event()
    watching = asyncio.create_task(_watch_departure(ws, gone))
    try:
        placed = await _placed_or_unavailable(
            placing.place(request, deps, gone, dialect=dialect), "admit", deps)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    if isinstance(placed, refusals.Refusal):
        await refuse(ws, placed, deps, dialect)
        return
    deps.meters.admission_seconds.observe(time.perf_counter() - started)
    deps.meters.admissions.labels(pool, "new").inc()
    deps.meters.key_streams.labels(deps.meters.key_label(key.id)).inc()
    await run(ws, request, placed[0], placed[1], deps, dialect=dialect)


async def _watch_departure(ws: starlette_ws.WebSocket, gone: asyncio.Event) -> None:
    """Set ``gone`` when the client disconnects before its upgrade (it sends nothing
    until the 101, so the next event is its disconnect)."""
    if ws.client_state == starlette_ws.WebSocketState.CONNECTING:
        await ws.receive()  # the connect event, which the accept would read otherwise
    while (await ws.receive())["type"] != "websocket.disconnect":
        pass
    gone.set()


async def _placed_or_unavailable(
    placing_call: Awaitable[placing.Placed | refusals.Refusal], what: str, deps: wiring.Deps
) -> placing.Placed | refusals.Refusal:
    """Admission or resume; Redis unreachable is a clear refusal, never an exception."""
    try:
        return await placing_call
    except redis.RedisError as exc:
        deps.meters.redis_errors.labels(what).inc()
        log.warning("%s failed, Redis unreachable: %s", what, exc)
        return refusals.unavailable()


async def _resume(
    ws: starlette_ws.WebSocket, text: str, key: auth.ApiKey, conn: str, deps: wiring.Deps
) -> None:
    token = tokens.parse(text)
    if token is None:
        old = tokens.is_old(text)
        await refuse(ws, refusals.old_resume_token() if old else refusals.bad_resume_token(), deps)
        return
    if not key.allows(token.pool):
        await forbid(ws, key.refusal(token.pool), deps)
        return
    received = protocol.resume_received(resume_fields(ws))
    if isinstance(received, protocol.ProtocolError):  # before anything is claimed
        deps.meters.rejections.labels(received.code).inc()
        await ws.send_denial_response(responses.PlainTextResponse(str(received), 400))
        return
    request = admissions.Request(token.pool, key.id, key.max_streams or 0, token, conn)
    placed = await _placed_or_unavailable(placing.resume(request, received, deps), "resume",
                                          deps)
    if isinstance(placed, refusals.Refusal):
        await refuse(ws, placed, deps)
        return
    deps.meters.admissions.labels(placed[0].pool, "resume").inc()
    await run(ws, request, placed[0], placed[1], deps, received)


async def refuse(ws: starlette_ws.WebSocket, refusal: refusals.Refusal, deps: wiring.Deps,
                 dialect: dialects.Dialect = dialects.KYUTAI) -> None:
    """Upgrade (if not done yet), then the ``Error`` and a close, as Kyutai's server does
    (OpenAI's clients: an ``error`` event)."""
    deps.meters.rejections.labels(refusal.code).inc()
    if ws.application_state == starlette_ws.WebSocketState.CONNECTING:
        # uvicorn raises its ClientDisconnected (an OSError) for a client gone already
        with contextlib.suppress(starlette_ws.WebSocketDisconnect, OSError):
            await ws.accept(subprotocol=_subprotocol(ws, dialect))
    await tell(ws, refusal, dialect)


async def tell(ws: starlette_ws.WebSocket, refusal: refusals.Refusal,
               dialect: dialects.Dialect = dialects.KYUTAI) -> None:
    """Send the ``Error`` and close, if the client is still there to hear it."""
    if not _open(ws):
        return
    message = dialect.refusal(refusal)
    with contextlib.suppress(starlette_ws.WebSocketDisconnect):
        if dialect.opcode == frames.BINARY:
            await ws.send_bytes(message)
        else:
            await ws.send_text(message.decode())
        await ws.close(refusal.close_code)


def _subprotocol(ws: requests.HTTPConnection, dialect: dialects.Dialect) -> str | None:
    """OpenAI's clients may offer ``realtime`` (browsers must offer something)."""
    if dialect.keeps_streams:
        return None
    return realtime_events.subprotocol(ws.headers.get("sec-websocket-protocol", ""))


def _open(ws: starlette_ws.WebSocket) -> bool:
    connected = starlette_ws.WebSocketState.CONNECTED
    return ws.client_state == connected and ws.application_state == connected


async def run(
    ws: starlette_ws.WebSocket,
    request: admissions.Request,
    session: admissions.Session,
    opened: pods.Opened,
    deps: wiring.Deps,
    received: int | None = None,
    dialect: dialects.Dialect = dialects.KYUTAI,
) -> None:
    """Upgrade with the session's headers, relay (the pod's Ready first), move the
    stream to another pod each time its pod is lost (``router.moving``), settle.
    ``received``: a resuming client's count of the messages it has."""
    offset = _resume_offset(session, opened)
    headers = _extension_headers(request.token, offset)
    try:
        await ws.accept(subprotocol=_subprotocol(ws, dialect),
                        headers=headers if dialect.keeps_streams else headers[:1])
    except (starlette_ws.WebSocketDisconnect, OSError):  # the client left (ClientDisconnected)
        await _left_before_upgrade(ws, session, opened, deps)
        return
    # Taken right after the accept: uvicorn wrote the 101 without yielding to the loop.
    try:
        relay = relaying.Relay(
            ws.scope["extensions"][framing.HANDOVER]["protocol"],
            opened.link,
            deps.config.max_message_bytes,
            deps.meters,
            (deps.config.ping_interval_seconds, deps.config.ping_timeout_seconds),
            deps.config.send_timeout_seconds,
            dialect,
        )
    except framing.EarlyFrames as exc:
        await _early_frames(ws, session, opened, exc, deps)
        return
    if offset is not None:
        messages = session.earlier.messages if received is None else received
        relay.resumed(offset, messages, session.earlier.samples)
    deps.sessions.add(session)
    deps.meters.sessions_open.inc()
    try:
        end = await relay.run(opened.first, session.pod_gone,
                              _in_band(ws, request.token, offset))
        for _ in range(moving.MAX_MOVES):
            if not isinstance(end, proxying.Movable) or not relay.movable():
                break
            opened.link.abort()
            moved = await moving.move(relay, request, session, end, deps)
            if moved is None:
                break
            deps.sessions.discard(session)
            session, opened = moved
            deps.sessions.add(session)
            end = await relay.run_moved(opened.link, session.pod_gone)
    finally:
        deps.sessions.discard(session)
        deps.meters.sessions_open.dec()
        audio = (relay.samples - relay.samples_before) / protocol.SAMPLE_RATE + relay.turn_seconds
        deps.meters.key_audio_seconds.labels(deps.meters.key_label(request.key_id)).inc(audio)
    await finish(ws, relay, session, opened, end, deps)


async def _left_before_upgrade(
    ws: starlette_ws.WebSocket, session: admissions.Session, opened: pods.Opened,
    deps: wiring.Deps,
) -> None:
    """A resuming client (it holds the token) that left before its 101 may try again:
    the link is dropped (the pod keeps the stream) and the session detached. A new
    stream's client never got a token: the link is closed (the pod frees the slot at
    once) and the session released."""
    resuming = bool(resume_fields(ws).get(protocol.RESUME_TOKEN_HEADER))
    if resuming:
        opened.link.abort()
    else:
        await _close_link(session, opened, deps)
    await _settle(session, resuming, deps)


async def _early_frames(ws: starlette_ws.WebSocket, session: admissions.Session,
                        opened: pods.Opened, exc: framing.EarlyFrames, deps: wiring.Deps) -> None:
    """A client that did not wait for the 101: refused (close 1002), the stream ended."""
    log.info("session %s refused: %s", session.session_id, exc)
    deps.meters.rejections.labels("protocol_error").inc()
    await _close_link(session, opened, deps)
    await _settle(session, False, deps)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(ws.close(protocol.CloseCode.PROTOCOL_ERROR, str(exc)),
                               relaying.CLIENT_CLOSE_TIMEOUT_S)


async def finish(
    ws: starlette_ws.WebSocket,
    relay: relaying.Relay,
    session: admissions.Session,
    opened: pods.Opened,
    end: proxying.End,
    deps: wiring.Deps,
) -> None:
    """Tell each side what the other did, then settle the session in Redis."""
    said = log.warning if isinstance(end, proxying.PodLost) else log.info
    said("session %s on %s ended: %s", session.session_id, session.pod_id, describe(end))
    detach = proxying.detaches(end, protocol.resumable(resume_fields(ws)))
    abort = detach or isinstance(end, proxying.Movable)
    if abort:
        # A lost client that may resume: drop the link without a close frame, so that
        # the pod keeps the slot. A lost pod: nothing to wait for.
        opened.link.abort()
    _tell_client(relay, end, deps)
    if not abort:
        relay.finish_client_frame()
        await _close_link(session, opened, deps)
    await _settle(session, detach, deps)
    with contextlib.suppress(TimeoutError):  # the client's answer to our close
        await asyncio.wait_for(asyncio.shield(relay.client_gone), relaying.CLIENT_CLOSE_TIMEOUT_S)


async def _close_link(session: admissions.Session, opened: pods.Opened,
                      deps: wiring.Deps) -> None:
    """A clean end: the pod frees the slot once it reads the close. A pod that holds
    back a fast sender would read it only behind the audio it holds: the link is then
    dropped (at once, or after ``links.CLOSE_TIMEOUT_S`` without the pod's answer),
    which alone would keep the slot for a resume, and the pod is asked to end the
    stream. The pod keeps that request on the stream, so the slot is freed whichever it
    sees first, the drop or the request."""
    if not await opened.link.close():
        await pods.end_stream(session.address, session.pool, deps.config,
                              opened.pod_resume_token)


async def _settle(session: admissions.Session, detach: bool, deps: wiring.Deps) -> None:
    try:
        await (deps.admissions.detach(session) if detach else deps.admissions.release(session))
    except redis.RedisError as exc:
        deps.meters.redis_errors.labels("release").inc()
        log.warning("session %s not settled in Redis (its lease will): %s", session.session_id, exc)
    if detach:  # kept (and rebuilt after a Redis restart) until its resume grace ends
        deps.sessions.hold_detached(session, time.monotonic() + deps.config.resume_grace_seconds)


def _tell_client(relay: relaying.Relay, end: proxying.End, deps: wiring.Deps) -> None:
    if relay.refused is not None:  # the pod told the client (relayed), in its place
        deps.meters.rejections.labels(relay.refused.code).inc()
    if isinstance(end, proxying.PodLost):
        _refuse_relayed(relay, refusals.pod_lost(), deps)
    elif isinstance(end, proxying.PodShed):  # it could not move: the pod's own word
        deps.meters.rejections.labels(end.code).inc()
        if relay.tell_client(end.error):
            relay.close_client(end.close_code)
    elif isinstance(end, proxying.TooSlow):  # nothing can reach it: aborted already
        deps.meters.rejections.labels(protocol.ErrorCode.TOO_SLOW).inc()
    elif isinstance(end, proxying.PodClosed):
        unsendable = (protocol.CloseCode.NO_STATUS, protocol.CloseCode.LOST, protocol.CloseCode.TLS)
        code = protocol.CloseCode.NORMAL if end.code in unsendable else end.code
        relay.close_client(code, end.reason)


def _refuse_relayed(relay: relaying.Relay, refusal: refusals.Refusal, deps: wiring.Deps) -> None:
    """The ``Error`` and the close, where the flow to the client has room for them."""
    deps.meters.rejections.labels(refusal.code).inc()
    if relay.tell_client(relay.dialect.told(refusal)):
        relay.close_client(refusal.close_code)
    else:
        relay.abort_client()  # in the middle of a pod's frame: nothing more can be said


def describe(end: proxying.End) -> str:
    fields = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(end).items())
    return f"{type(end).__name__}({fields})"
