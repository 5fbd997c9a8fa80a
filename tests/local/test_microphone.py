"""``asrpool stream --mic``: live audio to a real pod, its words as the model hears them.

No sound device can exist here: the live path (``streaming.stream_live``) is driven by
an async source of the sample's frames at real time, the microphone module by a
stand-in for ``sounddevice`` (PortAudio's binding) that records the same frames, and
the command itself runs for real, saying it needs a sound input device."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import types
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from asrpool import cli
from asrpool.client import microphone, streaming
from asrpool.common import audio, protocol
from tests.support import kyutai_client, servers

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "hello.wav"
FRAME = protocol.FRAME_SIZE


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerProcess]:
    with servers.ServerProcess(tmp_path_factory.mktemp("mic"), batch_size=1) as server:
        server.wait_ready()
        yield server


def sample_frames(silence_first: float = 0.0) -> list[np.ndarray]:
    """The sample in 80 ms frames, after ``silence_first`` seconds of silence."""
    before = np.zeros(int(silence_first * protocol.SAMPLE_RATE), dtype=np.float32)
    pcm = np.concatenate([before, audio.load_audio(SAMPLE)])
    pcm = np.concatenate([pcm, np.zeros(-len(pcm) % FRAME, dtype=np.float32)])
    return [pcm[i:i + FRAME] for i in range(0, len(pcm), FRAME)]


async def at_real_time(frames: list[np.ndarray], speed: float = 4.0) -> AsyncIterator[np.ndarray]:
    for frame in frames:
        await asyncio.sleep(FRAME / protocol.SAMPLE_RATE / speed)
        yield frame


async def test_live_audio_is_transcribed_as_kyutais_client_hears_it(
        pod: servers.ServerProcess) -> None:
    """The same audio after the same second of silence as Kyutai's file client sends:
    the same words, up to the end of the audio (after it, the file client sends five
    seconds of silence before its marker, the live stream its marker at once)."""
    heard: list[dict[str, Any]] = []
    frames = sample_frames(silence_first=1.0)
    result = await streaming.stream_live(pod.ws_url, at_real_time(frames),
                                         on_message=heard.append)
    assert result.marker_seen
    pod.wait_idle()  # its one slot: a closed stream frees it a moment later
    expected = await kyutai_client.transcribe(pod.ws_url, audio.load_audio(SAMPLE),
                                              realtime=4.0)
    ends = len(frames) * FRAME / protocol.SAMPLE_RATE - 0.5

    def words(messages: list[dict[str, Any]]) -> list[str]:
        return [m["text"] for m in messages if m["type"] == "Word" and m["start_time"] < ends]

    assert words(heard) and words(heard) == words(expected)


class FakeInputStream:
    """Stands in for sounddevice.InputStream: calls back from its own thread with
    80 ms blocks of the sample, as PortAudio does with a microphone's."""

    blocks: ClassVar[list[np.ndarray]] = []

    def __init__(self, *, samplerate: int, channels: int, dtype: str, blocksize: int,
                 device: object, callback: Callable[..., None]) -> None:
        assert (samplerate, channels, dtype, blocksize) == (24_000, 1, "float32", FRAME)
        self.callback = callback
        self.thread = threading.Thread(target=self._record, daemon=True)

    def _record(self) -> None:
        for block in self.blocks:
            time.sleep(0.01)
            self.callback(block[:, None], len(block), None, None)

    def __enter__(self) -> FakeInputStream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join()


async def test_the_microphone_module_yields_what_was_recorded_until_stopped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    frames = sample_frames()[:20]
    FakeInputStream.blocks = frames
    monkeypatch.setitem(sys.modules, "sounddevice",
                        types.SimpleNamespace(InputStream=FakeInputStream))
    stop = asyncio.Event()
    got = []
    async for frame in microphone.frames(stop):
        got.append(frame)
        if len(got) == 10:
            stop.set()  # what was recorded meanwhile still comes, then no more
    await asyncio.sleep(0)
    assert 10 <= len(got) <= len(frames)
    assert all(np.array_equal(a, b) for a, b in zip(got, frames, strict=False))


def test_without_a_sound_device_the_command_says_so(
        pod: servers.ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    if microphone.problem() is None:  # a machine with a microphone: not this test's case
        pytest.fail("this machine has a sound input device: the test needs one without")
    assert cli.main(["stream", pod.ws_url, "--mic"]) == 1
    assert "--mic needs a sound input device" in capsys.readouterr().err
