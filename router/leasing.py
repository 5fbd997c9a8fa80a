"""Background loops: renew this router's session leases; keep the pool gauges fresh.

Both tolerate a Redis outage: they log, count the error and try again next period, so
open streams never depend on Redis being up. Renewal also rebuilds the records of a
Redis that came back empty, those of the sessions this router detached (held by their
pods for a resume) included, until their resume grace ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import redis
import redis.asyncio as aioredis

from asrpool.router import admissions, metrics, settings, views

log = logging.getLogger(__name__)

RENEW_BATCH = 50  # sessions per call
Item = TypeVar("Item")
Reply = TypeVar("Reply")


async def renew_forever(
    store: admissions.Admissions,
    sessions: admissions.Sessions,
    config: settings.RouterSettings,
    meters: metrics.Metrics,
) -> None:
    period = config.session_lease_ms / 3000
    while True:
        await asyncio.sleep(period)
        async for session, pod_alive in _in_batches(
                sessions.snapshot(), store.renew, meters, "renew the leases of"):
            note_heartbeat(session, pod_alive, config)
        await keep_detached(store, sessions, meters)


async def keep_detached(
    store: admissions.Admissions, sessions: admissions.Sessions, meters: metrics.Metrics
) -> None:
    """Keep the records of the sessions this router detached until their grace ends
    (a Redis restart would make them unresumable while their pod holds them)."""
    async for held, still in _in_batches(
            sessions.detached(time.monotonic()), store.keep_detached, meters, "keep detached"):
        if not still:  # resumed, or released: no longer this router's
            sessions.drop_detached(held.session)


async def _in_batches(
    items: list[Item], call: Callable[[list[Item]], Awaitable[list[Reply]]],
    meters: metrics.Metrics, what: str,
) -> AsyncIterator[tuple[Item, Reply]]:
    """Each item with its reply, ``RENEW_BATCH`` items per call, so that no one call
    holds the loop (and every relayed stream) for long: each round trip lets it run.
    Redis failing ends the round (counted, logged): the next period tries again."""
    for start in range(0, len(items), RENEW_BATCH):
        batch = items[start : start + RENEW_BATCH]
        try:
            replies = await call(batch)
        except redis.RedisError as exc:
            _unless_cancelled()
            meters.redis_errors.labels("renew").inc()
            log.warning("cannot %s %d sessions: %s", what, len(items), exc)
            return
        for pair in zip(batch, replies, strict=True):
            yield pair


def note_heartbeat(
    session: admissions.Session, pod_alive: bool, config: settings.RouterSettings
) -> None:
    """A pod whose heartbeat stays missing for longer than its lease (and a Redis
    restart's refill) is gone: end its sessions, as a closed socket would."""
    session.missed_beats = 0 if pod_alive else session.missed_beats + 1
    if session.missed_beats * config.session_lease_ms / 3 >= config.pod_gone_after_ms:
        session.pod_gone.set()


async def watch_pools(client: aioredis.Redis, meters: metrics.Metrics, period: float = 1.0) -> None:
    while True:
        try:
            snapshot = await views.pools_json(client)
        except redis.RedisError as exc:
            _unless_cancelled()
            meters.redis_errors.labels("watch").inc()
            log.debug("cannot read pools: %s", exc)
        else:
            for pool, body in snapshot["pools"].items():
                meters.free_slots.labels(pool).set(body["free_slots"])
                meters.malformed_heartbeats.labels(pool).set(len(body["malformed_heartbeats"]))
                meters.unread_pods.labels(pool).set(body["unread_pods"])
        await asyncio.sleep(period)


def _unless_cancelled() -> None:
    """A loop that was asked to stop while Redis failed stops: a cancellation that the
    Redis client turned into an error must not be taken for an outage and retried."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
