"""Cost from live metrics: the pod counts the audio its engine has transcribed."""

from __future__ import annotations

import numpy as np

from tests.support import kyutai_client, servers


async def test_audio_seconds_count_every_frame_the_engine_took(
    idle_server: servers.ServerProcess,
) -> None:
    before = idle_server.metric("asr_audio_seconds_total") or 0.0
    async with await kyutai_client.connect(idle_server.ws_url) as ws:
        await kyutai_client.expect(ws, "Ready")
        await ws.send(kyutai_client.audio(np.zeros(24_000 + 100, dtype=np.float32)))
        steps = 0
        while steps < 12:  # 12 whole frames in 1 s; the 100-sample rest waits
            steps += (await kyutai_client.receive(ws))["type"] == "Step"
    taken = (idle_server.metric("asr_audio_seconds_total") or 0.0) - before
    assert abs(taken - 12 * 0.08) < 1e-9
