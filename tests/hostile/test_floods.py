"""One client cannot stall the other streams of its pod: messages per second per
connection are budgeted (a frame's worth of audio is free) and markers waiting for
their audio are bounded; the abuser gets an ``Error`` that says why and a close,
directly and through the router, while a neighbour on the same pod gets its transcript,
word for word what it gets alone.

Before: a flood of tiny frames or markers from one near-idle sender delayed a real-time
neighbour by seconds (median 0.7-1 s, max 12.6 s); the markers of a client sending no
audio piled up without bound. The neighbour's latency is measured in ``asrpool bench
soak``, not here.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import websockets

from asrpool.common import protocol
from tests.hostile import conftest
from tests.router import support
from tests.support import kyutai_client, streams

NEIGHBOUR = streams.random_speechlike(2.0, seed=5)
FLOOD = 20_000  # messages; over the default burst of 2,500 many times


async def _neighbour(platform: conftest.Platform, endpoint: str) -> list[tuple[Any, ...]]:
    got = await support.transcribe(platform.ws_url(endpoint), NEIGHBOUR,
                                   platform.headers(endpoint))
    return kyutai_client.words(got)


async def _flood(platform: conftest.Platform, endpoint: str, frame: bytes) -> dict[str, Any]:
    """Send ``frame`` FLOOD times as fast as possible; the Error the server answers."""
    opened = await support.connect(platform.ws_url(endpoint), platform.headers(endpoint))
    ws = opened.ws
    with contextlib.suppress(websockets.ConnectionClosed):
        for _ in range(FLOOD):
            await ws.send(frame)
    got = await support.until_closed(ws)
    errors = [m for m in got if m["type"] == "Error"]
    assert errors, f"no Error in {got[-3:]}"
    assert ws.close_code == protocol.CloseCode.POLICY
    return errors[-1]


async def _flood_beside_a_neighbour(platform: conftest.Platform, endpoint: str,
                                    frame: bytes) -> dict[str, Any]:
    alone = await _neighbour(platform, endpoint)
    await asyncio.to_thread(platform.wait_settled)  # its slot is freed a moment later
    error, beside = await asyncio.gather(_flood(platform, endpoint, frame),
                                         _neighbour(platform, endpoint))
    assert alone and beside == alone
    return error


async def test_a_flood_of_tiny_frames_is_closed_and_spares_its_neighbour(
        platform: conftest.Platform, endpoint: str) -> None:
    one_sample = kyutai_client.pack({"type": "Audio", "pcm": [0.0]})
    error = await _flood_beside_a_neighbour(platform, endpoint, one_sample)
    assert error["code"] == "too_many_messages"
    assert "messages per second" in error["message"]


async def test_a_flood_of_markers_is_closed_at_the_bound(
        platform: conftest.Platform, endpoint: str) -> None:
    error = await _flood_beside_a_neighbour(platform, endpoint, kyutai_client.marker(7))
    assert error["code"] == "too_many_markers"
    assert "at most 256" in error["message"]


async def test_audio_as_fast_as_the_pod_takes_it_in_small_chunks_is_not_budgeted(
        platform: conftest.Platform, endpoint: str) -> None:
    """A file client sending 1920-sample chunks flat out, and one sending 480-sample
    chunks (a quarter frame each): both get their whole transcript."""
    pcm = streams.random_speechlike(20.0, seed=6)
    opened = await support.connect(platform.ws_url(endpoint), platform.headers(endpoint))
    try:
        assert (await support.first_message(opened.ws))["type"] == "Ready"
        quarter = [{"type": "Audio", "pcm": pcm[i:i + 480]} for i in range(0, len(pcm) // 2, 480)]
        sender = asyncio.create_task(kyutai_client.send_paced(
            opened.ws, [*quarter, *support.messages(pcm)], None))
        got = await kyutai_client.until_marker(opened.ws, 0, timeout=90)
        await sender
    finally:
        await opened.ws.close()
    assert not [m for m in got if m["type"] == "Error"]
