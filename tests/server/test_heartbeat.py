"""The heartbeat in a real Redis: keys appear, free slots follow streams, SIGKILL expires them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import redis.asyncio as aioredis

from asrpool.common import registry
from tests.server import conftest
from tests.support import kyutai_client, polling, redis_servers, servers


async def test_heartbeat_follows_slots_and_expires_after_sigkill(
        tmp_path: Path, redis_server: redis_servers.RedisServer) -> None:
    redis = redis_server.client()
    with servers.ServerProcess(tmp_path, batch_size=conftest.BATCH, args=[
            "--redis-url", redis_server.url, "--pool", "blue",
            "--advertise-address", "10.0.0.7:8080"]) as server:
        server.wait_ready()
        key = registry.pod_key("blue", server.pod_id)
        await polling.until(lambda: redis.exists(key))
        beat = registry.PodHeartbeat.from_hash(redis.hgetall(key))
        assert (beat.pool, beat.address, beat.total_slots, beat.free_slots, beat.draining,
                beat.model) == ("blue", "10.0.0.7:8080", conftest.BATCH, conftest.BATCH,
                                False, "tiny")
        assert 0 < redis.pttl(key) <= registry.DEFAULT_LEASE_MS
        assert redis.zscore(registry.pool_pods_key("blue"), server.pod_id) is not None
        assert "blue" in redis.smembers(registry.POOLS_KEY)

        def free() -> int:
            return int(redis.hget(key, "free_slots") or -1)

        async with await kyutai_client.connect(server.ws_url) as ws:
            await kyutai_client.expect(ws, "Ready")
            await polling.until(lambda: free() == conftest.BATCH - 1)
        await polling.until(lambda: free() == conftest.BATCH)

        server.process.kill()  # type: ignore[union-attr]
        server.wait(10)
        lease_s = registry.DEFAULT_LEASE_MS / 1000
        await polling.until(lambda: not redis.exists(key), timeout=lease_s + 5)
        redis_async = aioredis.Redis.from_url(redis_server.url)
        assert await registry.read_pool(redis_async, "blue") == []
        await redis_async.aclose()


async def test_streaming_survives_a_redis_outage(
        tmp_path: Path, redis_server: redis_servers.RedisServer) -> None:
    redis = redis_server.client()
    with servers.ServerProcess(tmp_path, batch_size=conftest.BATCH, args=[
            "--redis-url", redis_server.url]) as server:
        server.wait_ready()
        key = registry.pod_key(registry.DEFAULT_POOL, server.pod_id)
        await polling.until(lambda: redis.exists(key))
        redis_server.kill()
        pcm = np.random.default_rng(4).standard_normal(24_000).astype(np.float32) * 0.3
        messages = await kyutai_client.transcribe(server.ws_url, pcm, short=True)
        assert (messages[-1]["type"], messages[-1]["id"]) == ("Marker", 0)
        assert server.http_status("/readyz") == 200
        redis_server.start()  # an empty Redis on the same port: the pod comes back
        redis = redis_server.client()
        await polling.until(lambda: redis.exists(key))
        assert "heartbeat to Redis failed" in server.log()
