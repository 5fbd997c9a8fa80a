"""Slots: exactly B streams at once, the rest told "no free channels"; the endpoints."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np

from tests.server import conftest
from tests.support import kyutai_client, servers


async def test_one_more_client_than_slots_gets_busy(idle_server: servers.ServerProcess) -> None:
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(
            await kyutai_client.connect(idle_server.ws_url)) for _ in range(conftest.BATCH + 1)]
        firsts = await asyncio.gather(*(kyutai_client.receive(ws) for ws in clients))
        kinds = sorted(m["type"] for m in firsts)
        assert kinds == ["Error"] + ["Ready"] * conftest.BATCH
        refused = clients[[m["type"] for m in firsts].index("Error")]
        error = firsts[[m["type"] for m in firsts].index("Error")]
        assert error == {"type": "Error", "message": "no free channels", "code": "busy"}
        await asyncio.wait_for(refused.wait_closed(), 10)
        assert idle_server.modules_info()["used_slots"] == conftest.BATCH
        assert idle_server.metric("asr_slots_free") == 0

        await clients[[m["type"] for m in firsts].index("Ready")].close()
        await _until(lambda: idle_server.modules_info()["used_slots"] == conftest.BATCH - 1)
        async with await kyutai_client.connect(idle_server.ws_url) as again:
            await kyutai_client.expect(again, "Ready")


async def test_endpoints(idle_server: servers.ServerProcess) -> None:
    assert idle_server.http_status("/healthz") == 200
    assert idle_server.http_status("/readyz") == 200
    info = idle_server.modules_info()
    assert info["total_slots"] == conftest.BATCH
    assert info["used_slots"] == 0
    async with await kyutai_client.connect(idle_server.ws_url) as ws:
        await kyutai_client.expect(ws, "Ready")
        assert ws.response is not None
        assert ws.response.headers["asrpool-session-id"]
        assert ws.response.headers["asrpool-resume-token"]
        await ws.send(kyutai_client.audio(np.zeros(24_000, dtype=np.float32)))
        await kyutai_client.expect(ws, "Step")  # the tiny model has extra heads
        assert idle_server.metric("asr_open_channels") == 1
        assert idle_server.modules_info()["used_slots"] == 1
    text = idle_server.http_get("/metrics")
    for name in ("asr_open_channels", "asr_model_step_duration_count", "asr_connect_total",
                 "asr_slots_total", "asr_slots_free", "asr_step_lag_seconds_count",
                 "asr_buffered_audio_seconds"):
        assert name in text, name
    assert (idle_server.metric("asr_model_step_duration_count") or 0) > 0


async def _until(condition: object, timeout: float = 10.0) -> None:
    assert callable(condition)
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)
