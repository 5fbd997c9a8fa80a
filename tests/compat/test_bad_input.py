"""Bad input ends that stream only, with an Error that says what was wrong, and frees
its slot; a healthy stream on the same pod carries on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websockets
from websockets.asyncio import client as ws_client

from tests.compat import clients, conftest
from tests.router import support
from tests.support import kyutai_client, oversized

Send = Callable[[ws_client.ClientConnection], Awaitable[None]]


async def _refused(endpoint: conftest.Endpoint, send_bad: Send) -> tuple[dict[str, Any], int]:
    """The Error and close code of a stream that sends ``send_bad``, next to a healthy one."""
    told, close_code = await _told_next_to_a_healthy_stream(endpoint, send_bad)
    assert told and told[-1]["type"] == "Error", [m["type"] for m in told]
    return told[-1], close_code


async def _told_next_to_a_healthy_stream(
        endpoint: conftest.Endpoint, send_bad: Send) -> tuple[list[dict[str, Any]], int]:
    """Every message a stream that sends ``send_bad`` is told, and its close code; a
    healthy stream next to it gets its marker back afterwards."""
    async with await clients.connect(endpoint) as good:
        async with await clients.connect(endpoint) as bad:
            await send_bad(bad)
            told = await _told(bad)
            close_code = bad.close_code
        await clients.used_slots_become(endpoint, 1, 5)  # the bad one's slot is free
        await clients.send_all(good, clients.with_marker(clients.chunked(
            np.zeros(clients.SECOND, dtype=np.float32), clients.FRAME)))
        await kyutai_client.until_marker(good, 0)
    assert close_code is not None
    return told, close_code


async def _told(ws: ws_client.ClientConnection) -> list[dict[str, Any]]:
    """Every message until the server closes."""
    told: list[dict[str, Any]] = []
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            told.append(await kyutai_client.receive(ws, timeout=30))
    await asyncio.wait_for(ws.wait_closed(), 10)
    return told


def _sending(*messages: dict[str, Any]) -> Send:
    async def send(ws: ws_client.ClientConnection) -> None:
        await clients.send_all(ws, messages)
    return send


async def test_a_frame_over_16_mib(endpoint: conftest.Endpoint) -> None:
    async def send(ws: ws_client.ClientConnection) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):  # refused mid-send
            await ws.send(b"\x00" * (17 << 20))

    error, close_code = await _refused(endpoint, send)
    assert (error["code"], close_code) == ("too_large", 1009)
    assert str(16 << 20) in error["message"]


@pytest.mark.parametrize("shape", list(oversized.SHAPES))
async def test_a_message_over_16_mib_right_behind_audio_lets_that_audios_results_out(
        endpoint: conftest.Endpoint, platform: conftest.Platform, shape: str) -> None:
    """As moshi-server: the results of the audio sent right before a message over the
    limit (one frame, or fragments of any size) still come back, its marker included,
    then the Error, then close 1009; nothing of the stream is left on the pod, the router
    or Redis; the other stream carries on."""
    message = oversized.SHAPES[shape]

    async def send(ws: ws_client.ClientConnection) -> None:  # the other stream holds a slot
        await oversized.send_after_audio(ws, message, lambda: endpoint.used_slots() == 1)

    told, close_code = await _told_next_to_a_healthy_stream(endpoint, send)
    oversized.check_refused(told, close_code, message)
    assert kyutai_client.words(told), "the words of the audio before the message are lost"
    await _nothing_left(endpoint, platform)


async def _nothing_left(endpoint: conftest.Endpoint, platform: conftest.Platform) -> None:
    """No slot used on the pod, no session the router holds in Redis."""
    await clients.used_slots_become(endpoint, 0, 30)
    await asyncio.to_thread(support.wait_until, lambda: conftest.settled(platform.router), 30,
                            "the router's sessions to end")


async def test_truncated_opus_pages(endpoint: conftest.Endpoint) -> None:
    pages = clients.opus_pages(np.zeros(2 * clients.SECOND, dtype=np.float32))
    broken = [pages[0], pages[1], pages[2][:40], *pages[3:]]  # 40 bytes of a 79-byte page
    error, close_code = await _refused(endpoint, _sending(*clients.opus_messages(broken)))
    assert (error["code"], close_code) == ("bad_audio", 1008)
    assert "Ogg" in error["message"]


async def test_opus_with_two_channels(endpoint: conftest.Endpoint, tmp_path: Path) -> None:
    stereo = clients.stereo_opus(tmp_path)
    error, _ = await _refused(endpoint, _sending(*clients.opus_messages([stereo])))
    assert error["code"] == "bad_audio" and "2 channels" in error["message"]


async def test_not_ogg_at_all(endpoint: conftest.Endpoint) -> None:
    error, _ = await _refused(endpoint, _sending({"type": "OggOpus", "data": b"RIFF" * 20}))
    assert error["code"] == "bad_audio"


@pytest.mark.parametrize("first", ["Audio", "OggOpus"])
async def test_audio_and_opus_are_not_mixed(endpoint: conftest.Endpoint, first: str) -> None:
    pcm = {"type": "Audio", "pcm": np.zeros(clients.FRAME, dtype=np.float32)}
    opus = clients.opus_messages(clients.opus_pages(np.zeros(clients.SECOND)))
    both = [pcm, *opus] if first == "Audio" else [*opus, pcm]
    error, close_code = await _refused(endpoint, _sending(*both))
    assert (error["code"], close_code) == ("mixed_audio", 1008)
