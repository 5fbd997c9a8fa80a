"""A Kyutai-like file client gets exactly the words of ``asrpool transcribe``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import sphn

from asrpool.common import audio
from tests.server import conftest, reference
from tests.support import kyutai_client, servers


def _transcribe_cli(wav: Path, batch_size: int) -> list[tuple[object, ...]]:
    result = subprocess.run(
        [sys.executable, "-m", "asrpool.cli", "transcribe", str(wav), "--model", "tiny",
         "--batch-size", str(batch_size), "--json"],
        capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})  # as the test server runs
    return kyutai_client.words(json.loads(line) for line in result.stdout.splitlines())


async def test_file_client_words_equal_transcribe(
        idle_server: servers.ServerProcess, tmp_path: Path) -> None:
    wav = tmp_path / "speech.wav"
    sphn.write_wav(str(wav), conftest.speechlike(3.0, seed=7), 24_000)
    pcm = audio.load_audio(wav)

    messages = await kyutai_client.transcribe(idle_server.ws_url, pcm)

    got = kyutai_client.words(messages)
    assert (messages[-1]["type"], messages[-1]["id"]) == ("Marker", 0)
    assert got == reference.file_words(pcm, conftest.BATCH)
    # `asrpool transcribe` runs on to the end of the message in which the marker returns,
    # so it may print a few words more than a client that stops at the marker.
    assert got == _transcribe_cli(wav, conftest.BATCH)[:len(got)]
    texts = {w[1] for w in got if w[0] == "Word"}
    assert len(texts) > 3, "the stream must produce varied words, or the test proves nothing"
    assert any(w[0] == "EndWord" for w in got)


async def test_two_streams_at_once_each_get_their_own_words(
        idle_server: servers.ServerProcess) -> None:
    first, second = conftest.speechlike(2.0, seed=1), conftest.speechlike(2.0, seed=2)
    got = await asyncio.gather(
        kyutai_client.transcribe(idle_server.ws_url, first, short=True),
        kyutai_client.transcribe(idle_server.ws_url, second, short=True))
    assert kyutai_client.words(got[0]) == reference.short_words(first, conftest.BATCH)
    assert kyutai_client.words(got[1]) == reference.short_words(second, conftest.BATCH)
    assert kyutai_client.words(got[0]) != kyutai_client.words(got[1])


async def test_init_in_a_burst_resets_in_message_order(
        idle_server: servers.ServerProcess) -> None:
    """Init sent straight after a burst of audio, as moshi-server handles it: the row
    resets after every frame sent before it and before any sent after it, whatever the
    engine's progress when it arrives, and its Ready comes in that place among the
    results: what follows is the second stream's alone, from time 0."""
    first = conftest.speechlike(2.0, seed=10)
    second = conftest.speechlike(2.0, seed=11)
    burst = [{"type": "Audio", "pcm": first[i:i + kyutai_client.FRAME_SIZE]}
             for i in range(0, len(first), kyutai_client.FRAME_SIZE)]
    async with await kyutai_client.connect(idle_server.ws_url) as ws:
        await kyutai_client.expect(ws, "Ready")
        await kyutai_client.send_paced(ws, [*burst, {"type": "Init"},
                                            *kyutai_client.short_messages(second)])
        got = await kyutai_client.until_marker(ws, 0)
    kinds = [m["type"] for m in got]
    assert kinds.count("Ready") == 1
    before, after = got[:kinds.index("Ready")], got[kinds.index("Ready") + 1:]
    assert sum(m["type"] == "Step" for m in before) == len(burst)  # every frame of the first
    assert kyutai_client.words(after) == reference.short_words(second, conftest.BATCH)


async def test_init_starts_a_fresh_stream_in_the_same_slot(
        idle_server: servers.ServerProcess) -> None:
    """Init resets the model row (as moshi-server, buffered audio stays: the test waits
    until the engine has taken all of it)."""
    noise = conftest.speechlike(2.0, seed=8)
    pcm = conftest.speechlike(2.0, seed=9)
    async with await kyutai_client.connect(idle_server.ws_url) as ws:
        await kyutai_client.expect(ws, "Ready")
        whole_frames = np.zeros(20 * kyutai_client.FRAME_SIZE, dtype=np.float32)
        await kyutai_client.send_paced(ws, [
            *kyutai_client.short_messages(noise, marker_id=1)[:-5],
            {"type": "Audio", "pcm": whole_frames}])
        await kyutai_client.until_marker(ws, 1)
        while idle_server.metric("asr_buffered_audio_seconds"):
            await asyncio.sleep(0.05)
        await ws.send(kyutai_client.pack({"type": "Init"}))
        while (await kyutai_client.receive(ws))["type"] != "Ready":
            pass  # results of the old stream still in flight may come first
        sender = asyncio.create_task(
            kyutai_client.send_paced(ws, kyutai_client.short_messages(pcm)))
        got = await kyutai_client.until_marker(ws, 0)
        await sender
    assert kyutai_client.words(got) == reference.short_words(pcm, conftest.BATCH)
