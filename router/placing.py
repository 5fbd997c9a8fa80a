"""Finding a stream its pod: admit in Redis, open on the pod, retry elsewhere on a refusal.

Redis admission is conservative but the pod is the final arbiter of its slots: when a
pod refuses (or cannot be reached), the reservation is released and the next pod the
policy picks is tried, up to ``pod_attempts`` pods. With ``queue_timeout_seconds`` set, a busy
pool is waited on (first come, first served across routers) until the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence

import redis

from asrpool.common import protocol, rates
from asrpool.router import admissions, dialects, pods, refusals, scripts, settings, wiring

log = logging.getLogger(__name__)

Placed = tuple[admissions.Session, pods.Opened]


def refusal_for(
    refused: admissions.Refused, request: admissions.Request, config: settings.RouterSettings
) -> refusals.Refusal:
    match refused.reason:
        case scripts.Denial.UNKNOWN_POOL:
            return refusals.unknown_pool(request.pool)
        case scripts.Denial.KEY_LIMIT:
            return refusals.key_limit(request.key_id, request.key_limit)
        case scripts.Denial.QUEUE_FULL:
            return refusals.queue_full(config.queue_max)
        case scripts.Denial.KEY_QUEUE_FULL:
            return refusals.key_queue_full(request.key_id, config.queue_max_per_key)
        case scripts.Denial.BAD_RESUME_TOKEN:
            return refusals.bad_resume_token()
        case scripts.Denial.POD_GONE:
            return refusals.pod_gone()
        case scripts.Denial.BUSY:
            return refusals.busy()


async def place(
    request: admissions.Request, deps: wiring.Deps, gone: asyncio.Event | None = None,
    avoid: Sequence[str] = (), dialect: dialects.Dialect = dialects.KYUTAI,
) -> Placed | refusals.Refusal:
    """Raises :class:`redis.RedisError` when Redis cannot be reached. ``gone`` is set
    when the client leaves: from then on nothing more is reserved or dialled, and what
    was is given back (its queue ticket, its reservation, its pod link). ``avoid``:
    pods not to try (a moved stream's lost pod). ``dialect``: the protocol the stream
    is opened in on the pod."""
    config = deps.config
    gone = gone or asyncio.Event()
    ticket = uuid.uuid4().hex if config.queue_timeout_seconds > 0 else ""
    deadline = time.monotonic() + config.queue_timeout_seconds
    tried: list[str] = list(avoid)
    while not gone.is_set():
        got = await deps.admissions.admit(request, tried, ticket)
        if isinstance(got, admissions.Refused):
            if got.reason == scripts.Denial.BUSY and ticket and time.monotonic() < deadline:
                await _wait(gone, config.queue_poll_seconds)
                continue
            if ticket:
                busy = got.reason == scripts.Denial.BUSY
                await deps.admissions.leave_queue(request, ticket, busy)
            return refusal_for(got, request, deps.config)
        # The dial is not cancelled when the client leaves meanwhile (it is bounded by
        # pod_connect_timeout_seconds): a link dropped half open would leave the pod holding
        # the slot for a resume; a link closed cleanly frees it at once.
        outcome = await pods.open_stream(got.address, got.pool, config, dialect=dialect)
        if gone.is_set():
            return await _give_back(got, outcome, deps)
        if isinstance(outcome, pods.Opened):
            await attach(got, outcome, deps)
            return got, outcome
        log.info("pod %s did not take a stream: %s", got.pod_id, outcome)
        await deps.admissions.release(got)
        if isinstance(outcome, pods.Refused) and outcome.code == rates.TOO_MANY_STREAMS:
            return refusals.pod_throttled()  # told at once: a busy answer would be demand
        tried.append(got.pod_id)
        if len(tried) - len(avoid) >= config.pod_attempts:
            return refusals.busy()
    if ticket:
        await deps.admissions.leave_queue(request, ticket)
    return refusals.client_left()


async def _give_back(
    session: admissions.Session, outcome: pods.Outcome, deps: wiring.Deps
) -> refusals.Refusal:
    """The client left while its stream was being opened: close the pod link, release."""
    if isinstance(outcome, pods.Opened):
        await outcome.link.close()
    await deps.admissions.release(session)
    return refusals.client_left()


async def _wait(gone: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(gone.wait(), seconds)


async def attach(session: admissions.Session, opened: pods.Opened, deps: wiring.Deps) -> None:
    """Record what the pod said. The stream is open whatever Redis does now: if it is
    down, lease renewal writes the record once it is back."""
    session.pod_session_id = opened.pod_session_id
    session.pod_resume_token = opened.pod_resume_token or session.pod_resume_token
    try:
        await deps.admissions.attach(session)
    except redis.RedisError as exc:
        deps.meters.redis_errors.labels("attach").inc()
        log.warning("session %s open but not recorded yet: %s", session.session_id, exc)


async def _claim(
    request: admissions.Request, held: admissions.Admissions, config: settings.RouterSettings
) -> admissions.Session | admissions.Refused:
    """Claim the session for this connection. A pod whose heartbeat is missing may be
    alive and about to beat into a Redis that restarted empty: the claim is tried again
    for as long as the pod's live sessions would last (``pod_gone_after_ms``)."""
    deadline = time.monotonic() + config.pod_gone_after_ms / 1000
    while True:
        got = await held.resume(request)
        pod_missing = isinstance(got, admissions.Refused) and got.reason == scripts.Denial.POD_GONE
        if not pod_missing or time.monotonic() >= deadline:
            return got
        await asyncio.sleep(config.queue_poll_seconds)


async def resume(request: admissions.Request, received: int | None,
                 deps: wiring.Deps) -> Placed | refusals.Refusal:
    """Reattach to the pod that holds the session; ``received``: the messages its client
    has (of every pod's, for a moved stream). Raises :class:`redis.RedisError`."""
    got = await _claim(request, deps.admissions, deps.config)
    if isinstance(got, admissions.Refused):
        return refusal_for(got, request, deps.config)
    of_pod = None if received is None else max(received - got.earlier.messages, 0)
    outcome = await pods.open_stream(got.address, got.pool, deps.config,
                                     got.pod_resume_token, of_pod)
    if isinstance(outcome, pods.Opened):
        await attach(got, outcome, deps)
        return got, outcome
    await deps.admissions.release(got)
    if isinstance(outcome, pods.Refused) and outcome.code != protocol.ErrorCode.BAD_RESUME_TOKEN:
        return refusals.Refusal(outcome.message, outcome.code, protocol.CloseCode.INTERNAL)
    return refusals.bad_resume_token() if isinstance(outcome, pods.Refused) else refusals.pod_gone()
