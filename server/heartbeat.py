"""The pod's heartbeat into the Redis slot registry (schema: ``asrpool.common.registry``).

Redis being away never stops streaming: a failed write is logged (once per outage)
and retried at the next beat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import redis.asyncio as aioredis
import redis.exceptions

from asrpool.common import registry

logger = logging.getLogger(__name__)

REDIS_ERRORS = (redis.exceptions.RedisError, OSError, asyncio.TimeoutError)


async def claim_at_start(redis_client: aioredis.Redis, pool: str, pod_id: str, instance: str,
                         lease_ms: int) -> None:
    """Hold the pod id for this process (raises ``registry.PodIdTaken``); an unreachable
    Redis is no reason not to start: the beats claim it once Redis answers."""
    try:
        await registry.claim_at_start(redis_client, pool, pod_id, instance, lease_ms)
    except REDIS_ERRORS as exc:
        logger.warning("cannot claim pod id %s in Redis yet (will retry): %s", pod_id, exc)


async def hold(redis_client: aioredis.Redis, pool: str, pod_id: str, instance: str,
               lease_ms: int) -> None:
    """Renew the claim while the model loads (no beat is written before it is ready)."""
    with contextlib.suppress(*REDIS_ERRORS):
        await registry.claim(redis_client, pool, pod_id, instance, lease_ms)


async def run(redis_client: aioredis.Redis, snapshot: Callable[[], registry.PodHeartbeat],
              interval: float, lease_ms: int, wake: asyncio.Event, instance: str = "", *,
              announce: bool = True) -> None:
    """Write a beat every ``interval`` seconds, or at once when ``wake`` is set (with
    ``announce``, adding the pool to the pools set: registry.write_heartbeat)."""
    failing = False
    taken = False
    while True:
        wake.clear()
        try:
            written = await registry.write_heartbeat(redis_client, snapshot(), lease_ms,
                                                     instance, announce=announce)
        except REDIS_ERRORS as exc:
            if not failing:
                logger.warning("heartbeat to Redis failed (will retry): %s", exc)
            failing = True
        else:
            if failing:
                logger.info("heartbeat to Redis restored")
            failing = False
            if not written and not taken:
                logger.error("pod id %s is held by another process: not heartbeating "
                             "(give every pod its own --pod-id)", snapshot().pod_id)
            taken = not written
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(wake.wait(), interval)


async def withdraw(redis_client: aioredis.Redis, pod_id: str, pool: str,
                   instance: str = "") -> None:
    """Remove this process's record at a clean exit (never another process's)."""
    try:
        await registry.remove_pod(redis_client, pod_id, pool, instance)
    except REDIS_ERRORS as exc:
        logger.warning("could not remove pod %s from Redis (its lease will expire): %s",
                       pod_id, exc)
