"""Messages over the size limit through a router whose pod has no pod token (the local
platform's way, where any client may reach the pod too): the router refuses them from
a frame's header, one frame or the fragment that takes a fragmented message over the
limit, and tells the pod in the client's place; the client gets what a pod reached
directly answers, and the stream leaves nothing behind on the pod or in Redis."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from asrpool.router import keys
from tests.router import support
from tests.support import kyutai_client, oversized, servers
from tests.support.redis_servers import RedisServer

POOL = "default"


@dataclasses.dataclass
class Platform:
    pod: servers.ServerProcess
    router: support.RouterProcess


@pytest.fixture(scope="module")
def platform(module_redis: RedisServer,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    workdir: Path = tmp_path_factory.mktemp("oversized")
    pod = support.pod(module_redis.url, workdir, "tokenless", 2, POOL, token="")
    router = support.RouterProcess(module_redis.url, workdir)  # no pod token either
    try:
        pod.start()
        pod.wait_ready()
        router.start()
        support.wait_until(lambda: support.pods_in_view(router) == 1, 20, "the pod in view")
        yield Platform(pod, router)
    finally:
        router.kill()
        pod.stop()


@pytest.fixture
async def redis(module_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(module_redis.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.mark.parametrize("shape", list(oversized.SHAPES))
async def test_a_message_over_the_limit_right_behind_audio(
        platform: Platform, redis: aioredis.Redis, shape: str) -> None:
    """The marker sent before the message comes back, then too_large and close 1009
    (a pod without a pod token used to answer the router's refusal unknown_type, and
    a fragmented one failed with 1002); the slot and the session are freed."""
    message = oversized.SHAPES[shape]
    opened = await support.connect(platform.router.ws_url)
    async with opened.ws as ws:
        await kyutai_client.expect(ws, "Ready")
        assert await _held(platform, redis, opened.session_id) == (1, 1, 1)  # to be freed
        await oversized.send_after_audio(ws, message, lambda: _used(platform) == 0)
        told = await oversized.until_closed(ws)
    oversized.check_refused(told, ws.close_code, message)
    await support.async_wait_until(lambda: _nothing_left(platform, redis, opened.session_id),
                                   30, "the slot and the session to be freed")


async def _nothing_left(platform: Platform, redis: aioredis.Redis, session_id: str) -> bool:
    return await _held(platform, redis, session_id) == (0, 0, 0)


async def _held(platform: Platform, redis: aioredis.Redis,
                session_id: str) -> tuple[int, int, int]:
    """Slots used on the pod; the session's record and the pod's leases in Redis."""
    used = _used(platform)
    record = await redis.exists(keys.session(POOL, session_id))
    leases = await redis.zcard(keys.pod_sessions(POOL, platform.pod.pod_id))
    return used, record, leases


def _used(platform: Platform) -> int:
    return int(platform.pod.modules_info()["used_slots"])
