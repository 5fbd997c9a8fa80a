"""SIGTERM: draining at once, no new streams, open streams finish, exit 0."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from asrpool.common import registry
from tests.server import conftest, reference
from tests.support import kyutai_client, polling, redis_servers, servers


async def test_sigterm_lets_open_streams_finish_then_exits_0(
        tmp_path: Path, redis_server: redis_servers.RedisServer) -> None:
    redis = redis_server.client()
    pcm = conftest.speechlike(1.5, seed=5)
    with servers.ServerProcess(tmp_path, batch_size=conftest.BATCH, args=[
            "--redis-url", redis_server.url, "--drain-grace-seconds", "60",
            "--max-buffer-seconds", "1"]) as server:
        server.wait_ready()
        key = registry.pod_key(registry.DEFAULT_POOL, server.pod_id)
        await polling.until(lambda: redis.hget(key, "draining") == "0")
        async with await kyutai_client.connect(server.ws_url) as ws:
            await kyutai_client.expect(ws, "Ready")
            server.signal(signal.SIGTERM)
            await polling.until(lambda: redis.hget(key, "draining") == "1")
            assert server.http_status("/readyz") == 503
            assert server.http_status("/startupz") == 200  # started: no restart while draining
            async with await kyutai_client.connect(server.ws_url) as late:
                error = await kyutai_client.expect(late, "Error")
                assert error["code"] == "draining"
            sender = asyncio.create_task(
                kyutai_client.send_paced(ws, kyutai_client.short_messages(pcm), realtime=1.0))
            got = await kyutai_client.until_marker(ws, 0)
            sender.cancel()
        assert server.wait(60) == 0  # well within the 60 s grace
        assert kyutai_client.words(got) == reference.short_words(pcm, conftest.BATCH)
        assert redis.exists(key) == 0, "a clean exit withdraws the pod"


async def test_streams_past_the_grace_period_get_an_error(tmp_path: Path) -> None:
    with servers.ServerProcess(tmp_path, batch_size=conftest.BATCH, args=[
            "--drain-grace-seconds", "1"]) as server:
        server.wait_ready()
        async with await kyutai_client.connect(server.ws_url) as ws:
            await kyutai_client.expect(ws, "Ready")
            server.signal(signal.SIGTERM)
            error = await kyutai_client.error_while_streaming(ws, frames=400)
            assert (error["code"], error["message"].split(":")[0]) == (
                "draining", "server shutting down")
            assert 0 <= error["processed_seconds"] <= error["received_seconds"]
        assert server.wait(30) == 0
