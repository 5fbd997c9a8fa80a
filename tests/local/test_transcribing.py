"""The importable Python client (asrpool.client.transcribing) against a real pod: the
words of a file or an array as Kyutai's own file client hears them, at their times in
the caller's audio, and one error per refusal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from asrpool.client import errors, transcribing
from asrpool.common import audio, auth, protocol
from asrpool.common.protocol import ErrorCode
from tests.support import kyutai_client, servers

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "hello.wav"


@pytest.fixture(scope="module")
def one_slot_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerProcess]:
    with servers.ServerProcess(tmp_path_factory.mktemp("client"), batch_size=1) as server:
        server.wait_ready()
        yield server


@pytest.fixture
def pod(one_slot_pod: servers.ServerProcess) -> servers.ServerProcess:
    """The pod with its one slot free (a closed stream frees it a moment later)."""
    one_slot_pod.wait_idle()
    return one_slot_pod


async def test_a_files_words_are_those_kyutais_client_hears(
        pod: servers.ServerProcess) -> None:
    got = [word async for word in transcribing.words(pod.ws_url, SAMPLE, rtf=4.0)]
    pod.wait_idle()
    heard = await kyutai_client.transcribe(pod.ws_url, audio.load_audio(SAMPLE), realtime=4.0)
    expected = [m for m in heard if m["type"] == "Word"]
    assert got, "the tiny model says words for the sample: a comparison, not two empties"
    assert [w.text for w in got] == [m["text"] for m in expected]
    # Kyutai's file client sends a second of silence first: the times are the caller's.
    assert [w.start for w in got] == [round(m["start_time"] - 1.0, 3) for m in expected]


async def test_an_array_at_another_rate_is_resampled(pod: servers.ServerProcess) -> None:
    pcm = audio.load_audio(SAMPLE)
    at_16k = np.interp(np.arange(0, len(pcm), 1.5), np.arange(len(pcm)), pcm)
    got = [w async for w in transcribing.words(pod.ws_url, at_16k, sample_rate=16_000,
                                               rtf=4.0)]
    assert got  # same audio, another rate: words all the same


async def test_a_busy_pod_raises_busy(pod: servers.ServerProcess) -> None:
    holder = await kyutai_client.connect(pod.ws_url)
    try:
        await kyutai_client.expect(holder, "Ready")
        with pytest.raises(errors.Busy) as refused:
            async for _ in transcribing.words(pod.ws_url, SAMPLE):
                pass
    finally:
        await holder.close()
    assert refused.value.code == ErrorCode.BUSY
    assert isinstance(refused.value, errors.StreamError)


async def test_a_bad_key_raises_unauthorized(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"keys:\n  - id: team\n    sha256: {auth.hash_key('right')}\n")
    with servers.ServerProcess(tmp_path, batch_size=1,
                               args=["--api-keys-file", str(keys)]) as server:
        server.wait_ready()
        with pytest.raises(errors.Unauthorized):
            async for _ in transcribing.words(server.ws_url, SAMPLE, api_key="wrong"):
                pass
        got = [w async for w in transcribing.words(server.ws_url, SAMPLE, api_key="right",
                                                   rtf=4.0)]
    assert got


def test_a_source_that_is_not_audio_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(errors.StreamError, match="shape"):
        transcribing.samples_of(np.zeros((2, 100)))
    (tmp_path / "notes.txt").write_text("not audio")
    with pytest.raises(errors.StreamError):
        transcribing.samples_of(tmp_path / "notes.txt")


def test_every_refusal_a_client_can_act_on_has_its_own_error() -> None:
    for code in (ErrorCode.BUSY, ErrorCode.QUEUE_FULL, ErrorCode.KEY_LIMIT,
                 ErrorCode.KEY_QUEUE_FULL, ErrorCode.UNKNOWN_POOL, ErrorCode.UNAVAILABLE,
                 ErrorCode.DRAINING, ErrorCode.POD_LOST, ErrorCode.BAD_RESUME_TOKEN,
                 ErrorCode.IDLE_TIMEOUT, ErrorCode.TOO_SLOW, ErrorCode.OVERLOADED,
                 ErrorCode.TOO_MANY_STREAMS):
        raised = errors.from_error({"type": "Error", "code": str(code), "message": "m"})
        assert type(raised) is not errors.Refused and raised.code == code, code
    bad = errors.from_error({"type": "Error", "code": "bad_audio", "message": "NaN"})
    assert isinstance(bad, errors.BadInput) and bad.code == "bad_audio"
    assert isinstance(errors.from_status(403), errors.ForbiddenPool)
    assert isinstance(errors.from_status(429), errors.TooManyStreams)
    assert errors.from_status(401).code == protocol.UNAUTHORIZED
