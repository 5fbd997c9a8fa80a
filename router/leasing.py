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

import redis
import redis.asyncio as aioredis

from asrpool.router import admissions, metrics, settings, views

log = logging.getLogger(__name__)

RENEW_BATCH = 50  # sessions per pipeline


async def renew_forever(
    store: admissions.Admissions,
    sessions: admissions.Sessions,
    config: settings.RouterSettings,
    meters: metrics.Metrics,
) -> None:
    period = config.session_lease_ms / 3000
    while True:
        await asyncio.sleep(period)
        held = sessions.snapshot()
        # In batches, so that no one pipeline holds the loop (and every relayed
        # stream) for long; each batch's round trip lets the loop run.
        for start in range(0, len(held), RENEW_BATCH):
            batch = held[start : start + RENEW_BATCH]
            try:
                alive = await store.renew(batch)
            except redis.RedisError as exc:
                meters.redis_errors.labels("renew").inc()
                log.warning("cannot renew %d session leases: %s", len(held), exc)
                break
            for session, pod_alive in zip(batch, alive, strict=True):
                note_heartbeat(session, pod_alive, config)
        await keep_detached(store, sessions, meters)


async def keep_detached(
    store: admissions.Admissions, sessions: admissions.Sessions, meters: metrics.Metrics
) -> None:
    """Keep the records of the sessions this router detached until their grace ends
    (a Redis restart would make them unresumable while their pod holds them)."""
    held = sessions.detached(time.monotonic())
    for start in range(0, len(held), RENEW_BATCH):
        batch = held[start : start + RENEW_BATCH]
        try:
            kept = await store.keep_detached(batch)
        except redis.RedisError as exc:
            meters.redis_errors.labels("renew").inc()
            log.warning("cannot keep %d detached sessions: %s", len(held), exc)
            return
        for d, still in zip(batch, kept, strict=True):
            if not still:  # resumed, or released: no longer this router's
                sessions.drop_detached(d.session)


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
            meters.redis_errors.labels("watch").inc()
            log.debug("cannot read pools: %s", exc)
        else:
            for pool, body in snapshot["pools"].items():
                meters.free_slots.labels(pool).set(body["free_slots"])
        await asyncio.sleep(period)
