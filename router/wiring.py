"""The router's dependencies: built once per process (in the app's lifespan) and passed in."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from asrpool.common import auth, heap, rates, redis_clients
from asrpool.router import admissions, forwarding, leasing, metrics, settings, throttling
from asrpool.router.admissions import Sessions

STOP_SECONDS = 2.0


@dataclasses.dataclass
class Deps:
    config: settings.RouterSettings
    redis: aioredis.Redis
    admissions: admissions.Admissions
    sessions: Sessions  # admissions.Sessions: the field above hides the module
    keyring: auth.KeyRing | None
    meters: metrics.Metrics
    new_streams: throttling.NewStreams
    draining: bool = False  # SIGTERM came (router.draining): no new streams, not ready


def connect_redis(config: settings.RouterSettings) -> aioredis.Redis:
    """A client that fails fast when Redis is gone and reconnects by itself."""
    return redis_clients.connect(config.redis_url, config.redis_timeout_seconds,
                                 password=config.redis_password_value(), decode_responses=True)


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
        new_streams=throttling.NewStreams(
            config.new_streams_per_second, config.new_streams_burst,
            meters.rejections.labels(rates.TOO_MANY_STREAMS).inc,
            proxies=forwarding.TrustedProxies(config.forwarded_allow_ips),
            share=1 / config.workers),
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
    heap.freeze_startup_objects()  # startup is done: see common.heap
    try:
        yield deps
    finally:
        await _stop(tasks, deps.redis)


async def _stop(tasks: list[asyncio.Task[None]], redis: aioredis.Redis) -> None:
    """End the loops and close Redis, each within STOP_SECONDS: a shutdown that waited
    on its Redis client without end (seen once in CI, past a 20 s grace) must not keep
    the process from exiting."""
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks, timeout=STOP_SECONDS)
    with contextlib.suppress(Exception):  # closing: nothing left to tell
        await asyncio.wait_for(redis.aclose(), STOP_SECONDS)
