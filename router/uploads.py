"""``POST /api/asr-streaming`` through the router: one slot for the length of the request.

The same admission as a websocket stream (pool from ``?pool=`` or the path, API key,
policy, a pod that refuses or cannot be reached is left for the next), then the body
is posted to that pod with the pod token, and the pod's answer (moshi-server's JSON
list of ``Word``/``EndWord``, or a 4xx/5xx with a one-line reason) is passed on. The
session counts against its pod and key until the pod has answered.

A body goes to a second pod only if the first never took it: it could not be reached,
or it answered 503 (it took no slot: busy, draining, loading). A pod that fails once it
has the body (it dies, it stops answering) is a 502, never a second post: a body that
kills one pod is not sent on to the next. A client that goes away cancels the post, so
the pod frees its slot too.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import aiohttp
import redis
from starlette import requests, responses

from asrpool.common import bodies, protocol
from asrpool.router import (
    admissions,
    placing,
    pods,
    poolnames,
    refusals,
    streaming,
    tokens,
    wiring,
)

log = logging.getLogger(__name__)

_POD_SECONDS = 3600.0  # a whole file at faster than real time; the pod bounds its own wait
_STATUS = {protocol.ErrorCode.UNKNOWN_POOL: 404, protocol.ErrorCode.KEY_LIMIT: 429,
           protocol.ErrorCode.BUSY: 503, protocol.ErrorCode.UNAVAILABLE: 503}


async def transcribe(
    request: requests.Request, pool: str | None, deps: wiring.Deps
) -> responses.Response:
    if deps.draining:  # router.draining: another router takes it
        return _refusal(refusals.router_draining(), deps)
    address = request.client.host if request.client else ""
    throttled = deps.new_streams.new_stream(address, request.headers.raw)
    key = streaming.authenticate(request, deps.keyring)
    if throttled is None and key is not None:
        throttled = deps.new_streams.of_key(key.id)
    if throttled is not None:  # an upload is a new stream: the same limits, before its body
        return responses.PlainTextResponse(throttled.message, throttled.status,
                                           throttled.headers)
    if key is None:
        return streaming.unauthorized(deps)
    asked = pool or deps.config.default_pool
    resolved = poolnames.resolve(asked, deps.config.pool_namespace)
    if resolved is None:
        return _refusal(refusals.unknown_pool(asked), deps)
    pool = resolved
    if not key.allows(pool):  # before a byte of the body is read
        deps.meters.rejections.labels(streaming.FORBIDDEN_POOL).inc()
        return _refused(403, key.refusal(pool))
    try:
        body = await bodies.read_limited(request, deps.config.max_upload_bytes,
                                         deps.config.body_pace)
    except bodies.TooLarge as exc:
        return _refused(413, str(exc))
    except bodies.TooSlow as exc:
        return _refused(408, str(exc))
    token = tokens.mint(pool, tokens.new_session_id())
    ask = admissions.Request(pool, key.id, key.max_streams or 0, token, uuid.uuid4().hex)
    gone = asyncio.ensure_future(bodies.disconnected(request))
    try:
        return await bodies.unless_gone(gone, _on_a_pod(ask, body, deps))
    except bodies.ClientGone as exc:  # the post to the pod is cancelled: its slot frees
        return _refused(499, str(exc))
    except redis.RedisError as exc:
        deps.meters.redis_errors.labels("admit").inc()
        log.warning("upload not admitted, Redis unreachable: %s", exc)
        return _refusal(refusals.unavailable(), deps)
    finally:
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)


async def _on_a_pod(ask: admissions.Request, body: bytes, deps: wiring.Deps) -> responses.Response:
    tried: list[str] = []
    while len(tried) < deps.config.pod_attempts:
        got = await deps.admissions.admit(ask, tried)
        if isinstance(got, admissions.Refused):
            return _refusal(placing.refusal_for(got, ask, deps.config), deps)
        answer = await _held(got, body, deps)
        if answer is not None:
            return answer
        tried.append(got.pod_id)
    return _refusal(refusals.busy(), deps)


async def _held(
    session: admissions.Session, body: bytes, deps: wiring.Deps
) -> responses.Response | None:
    """The pod's answer, or None when it took no slot or was never reached (try
    another)."""
    await deps.admissions.attach(session)
    deps.sessions.add(session)  # renewed while the pod works
    try:
        status, text, kind = await _post(session, body, deps)
    except aiohttp.ClientConnectorError as exc:
        log.info("pod %s could not be reached for an upload: %s", session.pod_id, exc)
        return None
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("pod %s failed during an upload (not sent again): %s", session.pod_id, exc)
        return _refused(502, f"the pod failed during the upload ({type(exc).__name__}); "
                             "it is not sent to another pod")
    finally:
        deps.sessions.discard(session)
        await deps.admissions.release(session)
    if status == 503:  # busy, draining or loading: another pod may take it
        return None
    if status == 401:  # the pod's token is not its pool's: the client's key is not the cause
        log.warning("pod %s refused this router's pod token for %s", session.pod_id, session.pool)
        return None
    deps.meters.admissions.labels(session.pool, "upload").inc()
    return responses.Response(text, status_code=status, media_type=kind)


async def _post(session: admissions.Session, body: bytes,
                deps: wiring.Deps) -> tuple[int, str, str]:
    timeout = aiohttp.ClientTimeout(total=_POD_SECONDS,
                                    connect=deps.config.pod_connect_timeout_seconds)
    headers = {k: v for k, v in pods.headers(deps.config, session.pool).items()
               if k != protocol.RESUMABLE_HEADER}
    url = f"http://{session.address}{protocol.STREAMING_PATH}"
    async with (
        aiohttp.ClientSession(timeout=timeout) as client,
        client.post(url, data=body, headers=headers) as reply,
    ):
        return reply.status, await reply.text(), reply.content_type


def _refusal(refusal: refusals.Refusal, deps: wiring.Deps) -> responses.Response:
    deps.meters.rejections.labels(refusal.code).inc()
    return _refused(_STATUS.get(refusal.code, 503), refusal.message)


def _refused(status: int, message: str) -> responses.Response:
    return responses.PlainTextResponse(message, status_code=status)
