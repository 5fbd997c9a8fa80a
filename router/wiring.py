"""The router's dependencies: built once per process (in the app's lifespan) and passed in."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from redis import backoff, retry

from asrpool.common import auth
from asrpool.router import admissions, leasing, metrics, settings


@dataclasses.dataclass
class Deps:
    config: settings.RouterSettings
    redis: aioredis.Redis
    admissions: admissions.Admissions
    sessions: admissions.Sessions
    keyring: auth.KeyRing | None
    meters: metrics.Metrics


def connect_redis(config: settings.RouterSettings) -> aioredis.Redis:
    """A client that fails fast when Redis is gone (one retry covers a connection left
    stale by a Redis restart) and reconnects by itself when it is back."""
    return aioredis.Redis.from_url(
        config.redis_url,
        decode_responses=True,
        socket_timeout=config.redis_timeout_s,
        socket_connect_timeout=config.redis_timeout_s,
        retry=retry.Retry(backoff.NoBackoff(), 1),
    )


def build(config: settings.RouterSettings) -> Deps:
    redis = connect_redis(config)
    keyring = auth.load_keys(config.api_keys_file) if config.api_keys_file else None
    meters = metrics.Metrics()
    meters.publish_pricing(config.gpu_hour_price, config.gpus_per_pod)
    return Deps(
        config=config,
        redis=redis,
        admissions=admissions.Admissions(redis, config),
        sessions=admissions.Sessions(),
        keyring=keyring,
        meters=meters,
    )


@contextlib.asynccontextmanager
async def running(deps: Deps) -> AsyncIterator[Deps]:
    """Run the background loops (lease renewal, pool gauges) for the life of the app."""
    tasks = [
        asyncio.create_task(
            leasing.renew_forever(deps.admissions, deps.sessions, deps.config, deps.meters)
        ),
        asyncio.create_task(leasing.watch_pools(deps.redis, deps.meters)),
    ]
    try:
        yield deps
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await deps.redis.aclose()
