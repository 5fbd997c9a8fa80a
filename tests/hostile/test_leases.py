"""Leases never bring a session back: a renewal that reaches Redis after the release
(it was in flight when the stream ended) must not rewrite the record or count the slot."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from asrpool.router import admissions, keys, tokens
from tests.router import support
from tests.support.redis_servers import RedisServer


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


async def test_a_late_renewal_does_not_resurrect_a_released_session(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    await support.beat(redis, "a", total=1)
    store = admissions.Admissions(redis, support.config(redis_server.url))
    token = tokens.mint("default", tokens.new_session_id())
    session = await store.admit(admissions.Request("default", "k", 0, token, "conn-1"))
    assert isinstance(session, admissions.Session)
    await store.attach(session)
    await store.release(session)
    await store.renew([session])  # the renewal loop's snapshot still held it
    assert not await redis.exists(keys.session("default", session.session_id))
    assert await redis.zcard(keys.pod_sessions("default", "a")) == 0
    assert await redis.zcard(keys.key_sessions("k")) == 0
    again = await store.admit(admissions.Request(
        "default", "k", 0, tokens.mint("default", tokens.new_session_id()), "conn-2"))
    assert isinstance(again, admissions.Session), "the released slot must be free again"


async def test_renewal_still_rebuilds_what_a_redis_restart_lost(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    await support.beat(redis, "a", total=1)
    store = admissions.Admissions(redis, support.config(redis_server.url))
    token = tokens.mint("default", tokens.new_session_id())
    session = await store.admit(admissions.Request("default", "", 0, token, "conn-1"))
    assert isinstance(session, admissions.Session)
    await store.attach(session)
    await redis.flushall()  # Redis came back empty
    await store.renew([session])
    assert await redis.hget(keys.session("default", session.session_id), "conn") == "conn-1"
    assert await redis.zcard(keys.pod_sessions("default", "a")) == 1
