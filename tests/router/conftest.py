"""Fixtures the router suites share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from tests.support.redis_servers import RedisServer


@pytest.fixture
async def redis(module_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A text client of the module's Redis, for one test."""
    client = aioredis.Redis.from_url(module_redis.url, decode_responses=True)
    yield client
    await client.aclose()
