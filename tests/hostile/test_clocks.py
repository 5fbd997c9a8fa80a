"""One clock: heartbeats, leases and liveness are all timed by Redis's ``TIME``; a pod or
reader whose own clock is off never makes a live pod vanish (or a dead one linger)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from asrpool.common import registry
from asrpool.router import admissions, tokens, views
from tests.router import support
from tests.support.redis_servers import RedisServer

SKEW_MS = 60_000


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


def _skew(monkeypatch: pytest.MonkeyPatch, ms: int) -> None:
    monkeypatch.setattr(registry, "now_ms", lambda: int(time.time() * 1000) + ms)


async def test_a_pod_with_a_slow_clock_is_still_admitted_to(
        redis: aioredis.Redis, redis_server: RedisServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _skew(monkeypatch, -SKEW_MS)  # the pod's clock is a minute behind
    await support.beat(redis, "a", total=2, lease_ms=3000)
    store = admissions.Admissions(redis, support.config(redis_server.url))
    token = tokens.mint("default", tokens.new_session_id())
    request = admissions.Request("default", "", 0, token, "c")
    assert isinstance(await store.admit(request), admissions.Session)


async def test_a_reader_with_a_fast_clock_deletes_no_live_pod(
        redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    await support.beat(redis, "a", total=2, lease_ms=3000)
    _skew(monkeypatch, SKEW_MS)  # the reader's clock is a minute ahead
    assert [b.pod_id for b in await registry.read_pool(redis, "default")] == ["a"]
    assert [p.beat.pod_id for p in await views.read_pool(redis, "default")] == ["a"]
    assert await redis.zscore(registry.pool_pods_key("default"), "a") is not None


async def test_a_reader_counts_router_sessions_by_redis_time(
        redis: aioredis.Redis, redis_server: RedisServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    await support.beat(redis, "a", total=2, lease_ms=3000)
    store = admissions.Admissions(redis, support.config(redis_server.url))
    token = tokens.mint("default", tokens.new_session_id())
    request = admissions.Request("default", "", 0, token, "c")
    assert isinstance(await store.admit(request), admissions.Session)
    _skew(monkeypatch, SKEW_MS)
    assert [p.router_sessions for p in await views.read_pool(redis, "default")] == [1]
