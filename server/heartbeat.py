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


def connect(url: str, timeout: float = 0.5) -> aioredis.Redis:
    return aioredis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


async def run(redis_client: aioredis.Redis, snapshot: Callable[[], registry.PodHeartbeat],
              interval: float, lease_ms: int, wake: asyncio.Event) -> None:
    """Write a beat every ``interval`` seconds, or at once when ``wake`` is set."""
    failing = False
    while True:
        wake.clear()
        try:
            await registry.write_heartbeat(redis_client, snapshot(), lease_ms)
        except REDIS_ERRORS as exc:
            if not failing:
                logger.warning("heartbeat to Redis failed (will retry): %s", exc)
            failing = True
        else:
            if failing:
                logger.info("heartbeat to Redis restored")
            failing = False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(wake.wait(), interval)


async def withdraw(redis_client: aioredis.Redis, pod_id: str, pool: str) -> None:
    try:
        await registry.remove_pod(redis_client, pod_id, pool)
    except REDIS_ERRORS as exc:
        logger.warning("could not remove pod %s from Redis (its lease will expire): %s",
                       pod_id, exc)
