"""Real-time clients of OpenAI's Realtime API for ``bench server --protocols realtime``.

Each sends its audio at real time as ``input_audio_buffer.append`` events of one 80 ms
frame (base64 16-bit PCM at 24 kHz, as the official SDK sends it), then commits, and
times two things a user of the protocol waits for: ``session.created`` after the
connection is asked for, and the turn's ``...transcription.completed`` after its commit.
The pod's own cost per frame is the bench's (``loop_us_per_frame``), from the frames sent.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import numpy as np
from websockets.asyncio import client as ws_client
from websockets.exceptions import InvalidStatus

from asrpool.common import protocol, realtime_events

FRAME = protocol.FRAME_SIZE
FRAME_SECONDS = FRAME / protocol.SAMPLE_RATE
COMPLETED = "conversation.item.input_audio_transcription.completed"


def url_of(http_base: str) -> str:
    """The pod's (or router's) realtime URL, from its ``http://HOST:PORT``."""
    base = http_base.replace("http", "ws", 1)
    return f"{base}{realtime_events.PATH}?intent={realtime_events.INTENT}"


def appends(seconds: float, seed: int, bank_frames: int = 50) -> list[str]:
    """``seconds`` of noise as one append per frame (a bank of distinct frames, repeated)."""
    frames = int(seconds / FRAME_SECONDS)
    rng = np.random.default_rng(seed)
    pcm = (0.2 * rng.standard_normal(min(frames, bank_frames) * FRAME) * 32767).astype("<i2")
    bank = [json.dumps({"type": "input_audio_buffer.append",
                        "audio": base64.b64encode(pcm[i:i + FRAME].tobytes()).decode()})
            for i in range(0, len(pcm), FRAME)]
    return [bank[i % len(bank)] for i in range(frames)]


def run_group(url: str, seconds: float, seeds: list[int]) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(_client(url, seconds, seed) for seed in seeds)))
    return asyncio.run(run())


async def _client(url: str, seconds: float, seed: int) -> dict[str, Any]:
    events = appends(seconds, seed)
    asked = time.monotonic()
    try:
        async with ws_client.connect(url, max_size=None, ping_timeout=None) as ws:
            first = json.loads(await ws.recv())
            created_s = time.monotonic() - asked
            if first.get("type") != "session.created":
                return {"refused": 1, "latencies": []}
            await _send_at_real_time(ws, events)
            committed = time.monotonic()
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            while json.loads(await asyncio.wait_for(ws.recv(), 60)).get("type") != COMPLETED:
                pass
            return {"refused": 0, "latencies": [], "frames": len(events),
                    "created_s": created_s, "completed_s": time.monotonic() - committed}
    except InvalidStatus:  # refused before the upgrade (HTTP 429 or 503)
        return {"refused": 1, "latencies": []}


async def _send_at_real_time(ws: ws_client.ClientConnection, events: list[str]) -> None:
    start = time.monotonic()
    for index, event in enumerate(events):
        delay = start + (index + 1) * FRAME_SECONDS - time.monotonic()
        if delay > 0:  # each frame once its audio has been spoken
            await asyncio.sleep(delay)
        await ws.send(event)
