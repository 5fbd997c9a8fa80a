"""A client sending as fast as it can: bounded memory, nothing lost, others keep pace.

The issue asks for 10 minutes of audio; on this 2-core CPU the tiny model runs that in
several minutes, so the suite sends ``ASRPOOL_TEST_FAST_SECONDS`` (default 40 s: about
600 steps, well past the 4 s buffer cap) and the benchmark covers longer runs.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import sphn

from tests.server import conftest, reference
from tests.support import kyutai_client, servers

CAP_SECONDS = 4.0
FAST_SECONDS = float(os.environ.get("ASRPOOL_TEST_FAST_SECONDS", "40"))


@pytest.fixture(scope="module", params=["loop", "intake"])
def capped_server(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerProcess]:
    """Streams' messages read on the pod's loop, then in intake processes."""
    workdir = tmp_path_factory.mktemp("capped")
    with servers.ServerProcess(workdir, batch_size=conftest.BATCH, args=[
            "--max-buffer-seconds", str(CAP_SECONDS),
            *conftest.intake_args(request.param)]) as server:
        server.wait_ready()
        yield server


async def _sample_rss(server: servers.ServerProcess, into: list[int]) -> None:
    while True:
        into.append(server.rss_bytes())
        await asyncio.sleep(0.2)


def _max_buffered(messages: list[dict[str, object]]) -> int:
    return max(int(str(m["buffered_pcm"])) for m in messages if m["type"] == "Step")


async def test_fast_client_is_held_back_without_loss(
        capped_server: servers.ServerProcess,
        record_property: Callable[[str, object], None]) -> None:
    fast_pcm = conftest.speechlike(FAST_SECONDS, seed=11)
    live_pcm = conftest.speechlike(3.0, seed=12)
    baseline = capped_server.rss_bytes()
    rss: list[int] = []
    sampler = asyncio.create_task(_sample_rss(capped_server, rss))
    try:
        fast, live = await asyncio.gather(
            kyutai_client.transcribe(capped_server.ws_url, fast_pcm, timeout=600),
            kyutai_client.transcribe(capped_server.ws_url, live_pcm, realtime=1.0))
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)

    cap = int(CAP_SECONDS * 24_000)
    # Past the cap the reader stops, so a buffer holds at most the cap plus one message
    # (the file client's largest is 1 s).
    assert _max_buffered(fast) < cap + 24_000, "the buffer grew past its cap"
    assert _max_buffered(fast) >= cap - 24_000, "the fast client never hit the cap"
    assert kyutai_client.words(fast) == reference.file_words(fast_pcm, conftest.BATCH)
    assert kyutai_client.words(live) == reference.file_words(live_pcm, conftest.BATCH)
    # The live stream kept pace: the engine served it a frame at every step, so it never
    # came near the cap that held the fast one back (how far behind it ran, in seconds,
    # is a timing: recorded here, measured in `asrpool bench server`).
    assert _max_buffered(live) < cap, "the real-time stream was held back"
    record_property("live_max_buffered_seconds", _max_buffered(live) / 24_000)
    growth = max(rss) - baseline
    record_property("rss_baseline_mib", baseline / 2**20)
    record_property("rss_growth_mib", growth / 2**20)
    assert growth < 64 * 2**20, f"server RSS grew by {growth / 2**20:.1f} MiB"


async def test_an_opus_message_is_decoded_only_as_far_as_the_buffer_has_room(
        capped_server: servers.ServerProcess) -> None:
    """20 s of Opus silence in one 40 KB message (a 16 MiB one would decode to some
    800 MB): the pod decodes its pages as its buffer drains, the rest waits encoded.
    Before, the whole message was decoded into the buffer at once."""
    writer = sphn.OpusStreamWriter(24_000)
    silence = np.zeros(1920, dtype=np.float32)
    seconds = 20
    data = b"".join(bytes(writer.append_pcm(silence)) for _ in range(seconds * 25 // 2))
    flush = b"".join(bytes(writer.append_pcm(silence)) for _ in range(5 * 25 // 2))
    async with await kyutai_client.connect(capped_server.ws_url) as ws:
        await kyutai_client.expect(ws, "Ready")
        await ws.send(kyutai_client.pack({"type": "OggOpus", "data": data}))
        await ws.send(kyutai_client.marker(0))
        await ws.send(kyutai_client.pack({"type": "OggOpus", "data": flush}))
        messages = await kyutai_client.until_marker(ws, 0, timeout=600)
    assert _max_buffered(messages) <= (CAP_SECONDS + 0.1) * 24_000
    steps = [m for m in messages if m["type"] == "Step"]
    assert len(steps) >= seconds * 25 // 2  # all of it was heard
