"""Redis run by Sentinel under the platform: real pods and a router on a primary, two
replicas and three sentinels; the primary SIGKILLed under streams fails over to a
replica, no stream is cut, no pod takes more than its slots, and new streams are
admitted again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets

from tests.router import support
from tests.router.test_pods import audio, running, stream_until_marker_or_close, times
from tests.support.redis_servers import RedisSentinelServers

SLOTS = 3


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[RedisSentinelServers]:
    servers = RedisSentinelServers(tmp_path / "redis")
    servers.workdir.mkdir()
    servers.start()
    try:
        yield servers
    finally:
        servers.stop()


async def test_a_primary_killed_under_streams_fails_over_and_cuts_none(
    sentinels: RedisSentinelServers, tmp_path: Path
) -> None:
    pods = [support.pod(sentinels.url, tmp_path, f"pod-{i}", slots=SLOTS) for i in range(2)]
    router = support.router(sentinels.url, tmp_path)
    with running(*pods, router):
        support.wait_until(lambda: support.pods_in_view(router) == 2, 20, "two pods")
        opened = [await support.connect(router.ws_url) for _ in range(4)]
        for stream in opened:
            assert (await support.first_message(stream.ws))["type"] == "Ready"
        streaming = [asyncio.create_task(stream_until_marker_or_close(s.ws, audio(i, 6.0), 1.0))
                     for i, s in enumerate(opened)]
        await asyncio.sleep(1.5)
        sentinels.primary().kill()
        killed = time.monotonic()
        for messages, closed in await asyncio.gather(*streaming):
            assert closed is None and not [m for m in messages if m["type"] == "Error"], messages
            assert times(messages) == sorted(times(messages))
        for stream in opened:
            await stream.ws.close()
        admitted = await _admitted_again(router)
        print(f"new streams admitted again {admitted - killed:.1f} s after the kill")
        for pod in pods:
            assert pod.modules_info()["used_slots"] <= SLOTS
            assert pod.metric('asr_errors_total{code="busy"}') is None  # never over-sent


async def _admitted_again(router: support.RouterProcess, timeout: float = 30.0) -> float:
    """When a new stream was first served through after the failover."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            finished = await support.transcribe(router.ws_url, audio(40, 1.0))
            if support.is_marker(finished[-1]):
                return time.monotonic()
        except (AssertionError, websockets.ConnectionClosed):
            pass  # refused while the registry has no primary: unavailable, try again
        assert time.monotonic() < deadline, "no stream admitted after the failover"
        await asyncio.sleep(0.2)
