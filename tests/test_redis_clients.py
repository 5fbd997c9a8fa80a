"""The one Redis client factory: a Redis that stops answering costs a bounded wait."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
import redis.exceptions

from asrpool.common import redis_clients
from tests.support import redis_servers


async def test_a_redis_that_stops_answering_fails_the_call_within_its_timeout(
    redis_server: redis_servers.RedisServer,
) -> None:
    client = redis_clients.connect(redis_server.url, 0.5)
    assert await client.ping()
    assert redis_server.process is not None
    redis_server.process.send_signal(signal.SIGSTOP)  # alive, accepting, answering nothing
    try:
        started = time.monotonic()
        with pytest.raises((redis.exceptions.TimeoutError, asyncio.TimeoutError)):
            await client.get("anything")
        assert time.monotonic() - started < 5.0  # two tries of 0.5 s, not forever
    finally:
        redis_server.process.send_signal(signal.SIGCONT)
    assert await client.ping()  # and it recovers by itself
    await client.aclose()
