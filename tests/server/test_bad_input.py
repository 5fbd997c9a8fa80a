"""Each kind of bad input is refused with a clear Error for that client only.

Every case runs next to a healthy stream on the same server, which must still get its
marker back afterwards: the server and the other streams carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import numpy as np
import pytest
import websockets
from websockets.asyncio import client as ws_client

from asrpool.common import protocol
from tests.server import conftest
from tests.support import kyutai_client, servers

Send = Callable[[ws_client.ClientConnection], Awaitable[None]]


async def _told(ws: ws_client.ClientConnection) -> list[dict[str, Any]]:
    """Every message the server sends until it closes (Ready already read)."""
    told: list[dict[str, Any]] = []
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            told.append(await kyutai_client.receive(ws, timeout=20))
    await asyncio.wait_for(ws.wait_closed(), 10)
    return told


def _error_last(told: list[dict[str, Any]]) -> dict[str, Any]:
    """The Error, which must be the last message before the close."""
    assert told and told[-1]["type"] == "Error", [m["type"] for m in told]
    return told[-1]


async def _healthy_round_trip(ws: ws_client.ClientConnection, marker_id: int) -> None:
    second = np.zeros(24_000, dtype=np.float32)
    await ws.send(kyutai_client.audio(np.random.default_rng(0).standard_normal(24_000)))
    await ws.send(kyutai_client.marker(marker_id))
    for _ in range(3):
        await ws.send(kyutai_client.audio(second))
    await kyutai_client.until_marker(ws, marker_id, timeout=30)


async def _keep_talking(ws: ws_client.ClientConnection) -> None:
    """Real-time silence, so the healthy stream is never idle."""
    frame = np.zeros(1920, dtype=np.float32)
    while True:
        await ws.send(kyutai_client.audio(frame))
        await asyncio.sleep(0.08)


async def _refused(server: servers.ServerProcess, send_bad: Send) -> dict[str, Any]:
    told, _ = await _told_next_to_a_healthy_stream(server, send_bad)
    return _error_last(told)


async def _told_next_to_a_healthy_stream(
        server: servers.ServerProcess, send_bad: Send) -> tuple[list[dict[str, Any]], int | None]:
    """What a stream that sends ``send_bad`` is told, and its close code; a healthy
    stream on the same server gets its marker back afterwards."""
    async with await kyutai_client.connect(server.ws_url) as good:
        await kyutai_client.expect(good, "Ready")
        talking = asyncio.create_task(_keep_talking(good))
        try:
            async with await kyutai_client.connect(server.ws_url) as bad:
                await kyutai_client.expect(bad, "Ready")
                await send_bad(bad)
                told = await _told(bad)
                close_code = bad.close_code
        finally:
            talking.cancel()
            await asyncio.gather(talking, return_exceptions=True)
        await _healthy_round_trip(good, marker_id=42)
    assert server.http_status("/healthz") == 200
    return told, close_code


def _sender(*frames: bytes | str) -> Send:
    async def send(ws: ws_client.ClientConnection) -> None:
        for frame in frames:
            await ws.send(frame)
    return send


async def test_malformed_messagepack(idle_server: servers.ServerProcess) -> None:
    error = await _refused(idle_server, _sender(b"\xc1\xff\x00garbage"))
    assert error["code"] == "malformed"
    assert "MessagePack" in error["message"]


async def test_map_without_type(idle_server: servers.ServerProcess) -> None:
    error = await _refused(idle_server, _sender(msgpack.packb({"pcm": [0.0] * 10})))
    assert error["code"] == "bad_message"
    assert "type" in error["message"]


async def test_unknown_type(idle_server: servers.ServerProcess) -> None:
    error = await _refused(idle_server, _sender(msgpack.packb({"type": "Shout"})))
    assert error["code"] == "unknown_type"
    assert "Shout" in error["message"]


async def test_a_routers_refusal_is_taken_from_any_link(
        idle_server: servers.ServerProcess) -> None:
    """A pod without a pod token has routers in front of it too (the local platform's):
    it takes a router's refusal of a client's message over the limit from any link, as
    the too_large it stands for (a client that forges one ends only its own stream)."""
    refusal = protocol.Refusal("message of 9 bytes exceeds the limit of 8 bytes",
                               protocol.ErrorCode.TOO_LARGE, protocol.CloseCode.TOO_LARGE)
    told, close_code = await _told_next_to_a_healthy_stream(
        idle_server, _sender(protocol.router_refusal(refusal)))
    assert (_error_last(told)["code"], close_code) == ("too_large", 1009)
    assert _error_last(told)["message"] == refusal.message


async def test_a_routers_refusal_of_another_kind_is_no_message(
        idle_server: servers.ServerProcess) -> None:
    """Routers refuse nothing else so: a 'refusal' that claims another code is a message
    of an unknown type, not an Error of the client's choosing."""
    forged = protocol.Refusal("the pod failed", protocol.ErrorCode.INTERNAL,
                              protocol.CloseCode.INTERNAL)
    error = await _refused(idle_server, _sender(protocol.router_refusal(forged)))
    assert error["code"] == "unknown_type"


async def test_pcm_of_the_wrong_type(idle_server: servers.ServerProcess) -> None:
    bad = msgpack.packb({"type": "Audio", "pcm": "not samples"})
    error = await _refused(idle_server, _sender(bad))
    assert error["code"] == "bad_message"
    assert "pcm" in error["message"]


@pytest.mark.parametrize("sample", [float("nan"), float("inf")], ids=["nan", "inf"])
async def test_non_finite_samples(idle_server: servers.ServerProcess, sample: float) -> None:
    bad = msgpack.packb({"type": "Audio", "pcm": [0.0] * 100 + [sample]})
    error = await _refused(idle_server, _sender(bad))
    assert error["code"] == "bad_audio"


async def test_frame_larger_than_the_maximum(idle_server: servers.ServerProcess) -> None:
    # The fixture sets --max-message-bytes 262144; 80,000 float32 samples are ~400 kB.
    too_big = kyutai_client.audio(np.zeros(80_000, dtype=np.float32))
    assert len(too_big) > 262_144
    error = await _refused(idle_server, _sender(too_big))
    assert error["code"] == "too_large"


async def test_a_frame_over_the_maximum_behind_audio_lets_that_audios_words_out(
        idle_server: servers.ServerProcess) -> None:
    """As moshi-server: the results of the audio received before a frame refused from
    its header still come back, then the Error, then close 1009."""
    speech = conftest.speechlike(2.0, seed=3)
    too_big = kyutai_client.audio(np.zeros(80_000, dtype=np.float32))
    frames = [kyutai_client.audio(speech[i:i + 1920]) for i in range(0, len(speech), 1920)]
    send = _sender(*frames, kyutai_client.audio(np.zeros(24_000, dtype=np.float32)), too_big)

    told, close_code = await _told_next_to_a_healthy_stream(idle_server, send)

    assert _error_last(told)["code"] == "too_large" and close_code == 1009
    assert kyutai_client.words(told), "the words of the audio before the frame are lost"


async def test_a_kyutai_silence_message_fits_the_default_limit(
        idle_server: servers.ServerProcess) -> None:
    # 1 s (24,000 samples) as float64, the largest thing Kyutai's client sends: ~216 kB.
    big = msgpack.packb({"type": "Audio", "pcm": [0.0] * 24_000}, use_single_float=False)
    async with await kyutai_client.connect(idle_server.ws_url) as ws:
        await kyutai_client.expect(ws, "Ready")
        await ws.send(big)
        await _healthy_round_trip(ws, marker_id=3)


async def test_text_frames_are_ignored(idle_server: servers.ServerProcess) -> None:
    async with await kyutai_client.connect(idle_server.ws_url) as ws:
        await kyutai_client.expect(ws, "Ready")
        await ws.send('{"type": "Audio"}')
        await _healthy_round_trip(ws, marker_id=7)


async def test_a_client_that_never_sends_is_dropped(idle_server: servers.ServerProcess) -> None:
    async def say_nothing(ws: ws_client.ClientConnection) -> None:
        return None

    error = await _refused(idle_server, say_nothing)  # the fixture's idle timeout: 1.5 s
    assert error["code"] == "idle_timeout"
    deadline = asyncio.get_running_loop().time() + 10
    while idle_server.modules_info()["used_slots"] and (
            asyncio.get_running_loop().time() < deadline):
        await asyncio.sleep(0.05)
    assert idle_server.modules_info()["used_slots"] == 0


@pytest.mark.parametrize("bad", [b"\xc1\xff\x00garbage", msgpack.packb({"type": "Nope"})])
async def test_the_results_of_the_audio_before_a_bad_message_come_before_its_error(
        idle_server: servers.ServerProcess, bad: bytes) -> None:
    """As on moshi-server, a bad message ends the stream only once every frame received
    before it has been stepped and its results sent: nothing the client sent is lost."""
    frames = 100
    pcm = np.random.default_rng(3).standard_normal(frames * 1920).astype(np.float32) * 0.1
    async with await kyutai_client.connect(idle_server.ws_url) as ws:
        await kyutai_client.expect(ws, "Ready")
        for i in range(frames):
            await ws.send(kyutai_client.audio(pcm[i * 1920:(i + 1) * 1920]))
        await ws.send(bad)
        got = []
        while (message := await kyutai_client.receive(ws, timeout=30))["type"] != "Error":
            got.append(message)
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert message["code"] in {"malformed", "unknown_type"}
    assert sum(m["type"] == "Step" for m in got) == frames
