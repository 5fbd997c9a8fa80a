"""Drain tells the truth: a stream cut at the end of the grace hears how far its audio
was transcribed, and streams held for a resume are waited for like attached ones."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import numpy as np
from websockets.asyncio import client as ws_client

from tests.support import kyutai_client, servers

SECOND = 24_000


async def _send_seconds(ws: ws_client.ClientConnection, seconds: float) -> None:
    pcm = np.zeros(int(seconds * SECOND), dtype=np.float32)
    for start in range(0, len(pcm), 1920):
        await ws.send(kyutai_client.audio(pcm[start:start + 1920]))


async def test_a_cut_stream_hears_how_far_it_was_transcribed(tmp_path: Path) -> None:
    with servers.ServerProcess(tmp_path, args=["--drain-grace-seconds", "1"]) as server:
        server.wait_ready()
        async with await kyutai_client.connect(server.ws_url) as ws:
            await kyutai_client.expect(ws, "Ready")
            await _send_seconds(ws, 2.0)
            server.signal(signal.SIGTERM)
            error = await kyutai_client.error_while_streaming(ws)
        assert error["code"] == "draining"
        assert error["message"].startswith("server shutting down")
        assert 2.0 <= error["processed_seconds"] <= error["received_seconds"]
        assert f"{error['processed_seconds']:.2f} s" in error["message"]
        assert server.wait(30) == 0


async def test_a_held_stream_is_waited_for_and_may_come_back(tmp_path: Path) -> None:
    with servers.ServerProcess(tmp_path, args=[
            "--drain-grace-seconds", "4", "--resume-grace-seconds", "30"]) as server:
        server.wait_ready()
        ws = await kyutai_client.connect(server.ws_url, {"asrpool-resumable": "1"})
        await kyutai_client.expect(ws, "Ready")
        assert ws.response is not None
        token = ws.response.headers["asrpool-resume-token"]
        await _send_seconds(ws, 1.0)
        ws.transport.abort()  # held for a resume; nothing is attached
        await asyncio.sleep(0.5)
        server.signal(signal.SIGTERM)
        await asyncio.sleep(1.0)
        assert server.poll() is None, "the pod did not wait for its held stream"
        async with await kyutai_client.connect(
                server.ws_url, {"asrpool-resume-token": token}) as again:
            await kyutai_client.expect(again, "Ready")
            error = await kyutai_client.error_while_streaming(again)
        assert error["code"] == "draining"
        assert error["processed_seconds"] >= 1.0
        assert server.wait(30) == 0
