"""Kyutai's clients' message patterns, against a pod and through a router: the words are
those of the same samples through the engine in-process (what moshi-server computes)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.compat import clients, conftest
from tests.server import reference
from tests.support import kyutai_client, streams


def _pcm(seconds: float, seed: int) -> np.ndarray:
    return streams.random_speechlike(seconds, seed)


async def test_kyutai_file_client(endpoint: conftest.Endpoint) -> None:
    """scripts/stt_from_file_rust_server.py: 1 s silence, 80 ms chunks, 5 s silence,
    marker, 1 s silences until the marker returns."""
    pcm = _pcm(3.0, seed=1)
    got = await clients.session(endpoint, kyutai_client.file_messages(pcm))
    assert kyutai_client.words(got) == reference.file_words(pcm, conftest.BATCH)
    assert kyutai_client.words(got)


async def test_kyutai_microphone_client(endpoint: conftest.Endpoint) -> None:
    """scripts/stt_from_mic_rust_server.py: 1920-sample chunks at real time; words arrive
    while it talks."""
    pcm = _pcm(2.0, seed=2)
    messages = clients.with_marker(clients.chunked(pcm, clients.FRAME))
    got = await clients.session(endpoint, messages, realtime=1.0)
    assert kyutai_client.words(got) == reference.words(messages, conftest.BATCH)


@pytest.mark.parametrize("chunk", [clients.FRAME, clients.SECOND, 10 * clients.SECOND])
async def test_chunk_sizes_give_the_same_words(endpoint: conftest.Endpoint, chunk: int) -> None:
    """80 ms, 1 s and 10 s messages (a 10 s float32 message is 1.2 MB: under 16 MiB)."""
    pcm = _pcm(10.0, seed=3)
    expected = reference.words(clients.with_marker(clients.chunked(pcm, clients.FRAME)),
                               conftest.BATCH)
    got = await clients.session(endpoint, clients.with_marker(clients.chunked(pcm, chunk)))
    assert kyutai_client.words(got) == expected


async def test_markers_come_back_in_order(endpoint: conftest.Endpoint) -> None:
    pcm = _pcm(2.0, seed=4)
    messages = [*clients.chunked(pcm[:24_000], clients.FRAME), {"type": "Marker", "id": 1},
                *clients.chunked(pcm[24_000:], clients.FRAME), {"type": "Marker", "id": 2}]
    got = await clients.session(endpoint, clients.with_marker(messages, marker_id=3), 3)
    assert [m["id"] for m in got if m["type"] == "Marker"] == [1, 2, 3]


@pytest.mark.parametrize("piece", [None, 1000, 37])
async def test_ogg_opus_pages_whole_or_split(endpoint: conftest.Endpoint,
                                             piece: int | None) -> None:
    """OggOpus input, in whole pages or cut anywhere (pages split across messages): the
    words are those of the decoded samples sent as Audio."""
    silence = np.zeros(3 * clients.SECOND, dtype=np.float32)
    pages = clients.opus_pages(np.concatenate([_pcm(2.0, seed=5), silence, silence]))
    cut = len(pages) * 2 // 3  # the marker goes after this page
    stream = b"".join(pages)
    head, tail = b"".join(pages[:cut]), stream[len(b"".join(pages[:cut])):]
    pieces = [pages[:cut], pages[cut:]] if piece is None else [
        clients.split(head, piece), clients.split(tail, piece)]
    decoded = clients.decoded([*pieces[0], *pieces[1]])
    as_audio = [{"type": "Audio", "pcm": pcm} for pcm in decoded]
    marker: list[dict[str, object]] = [{"type": "Marker", "id": 0}]
    expected = reference.words([*as_audio[:len(pieces[0])], *marker,
                                *as_audio[len(pieces[0]):]], conftest.BATCH)
    got = await clients.session(endpoint, [*clients.opus_messages(pieces[0]), *marker,
                                           *clients.opus_messages(pieces[1])])
    assert kyutai_client.words(got) == expected and expected


async def test_init_mid_stream_keeps_buffered_audio_and_markers(
        endpoint: conftest.Endpoint) -> None:
    """As moshi-server: Init answers Ready and resets the model row; the audio and the
    marker sent before it are not thrown away."""
    pcm = _pcm(2.0, seed=6)
    async with await clients.connect(endpoint) as ws:
        await clients.send_all(ws, [*clients.chunked(pcm, clients.SECOND),
                                    {"type": "Marker", "id": 9}, {"type": "Init"}])
        await clients.send_all(ws, clients.chunked(np.zeros(3 * clients.SECOND), clients.SECOND))
        got = await kyutai_client.until_marker(ws, 9)
    kinds = [m["type"] for m in got]
    assert "Ready" in kinds and kinds[-1] == "Marker"


async def test_init_after_the_audio_is_a_fresh_stream(endpoint: conftest.Endpoint) -> None:
    first, second = _pcm(2.0, seed=7), _pcm(2.0, seed=8)
    whole = [*clients.chunked(second, clients.FRAME)]
    async with await clients.connect(endpoint) as ws:
        await clients.send_all(ws, [*clients.chunked(first, clients.FRAME),
                                    {"type": "Marker", "id": 1},
                                    {"type": "Audio", "pcm": np.zeros(20 * clients.FRAME)}])
        await kyutai_client.until_marker(ws, 1)
        while endpoint.pod.metric("asr_buffered_audio_seconds"):
            await asyncio.sleep(0.05)
        await ws.send(kyutai_client.pack({"type": "Init"}))
        while (await kyutai_client.receive(ws))["type"] != "Ready":
            pass
        sender = asyncio.create_task(clients.send_all(ws, clients.with_marker(whole)))
        got = await kyutai_client.until_marker(ws, 0)
        await sender
    assert kyutai_client.words(got) == reference.words(clients.with_marker(whole),
                                                       conftest.BATCH)
