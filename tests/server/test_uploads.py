"""POST /api/asr-streaming as an attacker sends it: no upload costs more than its share.

Files are decoded in a child process bounded in memory and time (server.decoding), Opus
is measured from its packets before it is decoded and other formats are decoded no
further than ``max_upload_seconds``; a client that goes away frees its slot. The
decoded samples are those the pod decoded in its own process before.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import os
import socket
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sphn

from asrpool.bench import oggfiles
from asrpool.common import audio, oggopus
from asrpool.server import decoding
from tests.support import kyutai_client, servers, streams

MAX_SECONDS = 600.0
BODY_TIMEOUT = 1.5
ROOMY = decoding.Limits(3600.0, 4 << 30, 60.0)


@pytest.fixture(scope="module")
def upload_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerProcess]:
    workdir = tmp_path_factory.mktemp("uploads")
    with servers.ServerProcess(workdir, batch_size=2, args=[
            "--max-upload-seconds", str(MAX_SECONDS), "--resume-grace-seconds", "0",
            "--body-timeout-seconds", str(BODY_TIMEOUT),
            "--min-body-bytes-per-second", "100000"]) as server:
        server.wait_ready()
        yield server


def _wav(pcm: np.ndarray, rate: int, path: Path) -> bytes:
    sphn.write_wav(str(path), pcm, rate)
    return path.read_bytes()


def _multichannel_wav(seconds: float, channels: int, rate: int) -> bytes:
    samples = np.random.default_rng(3).integers(-3000, 3000, (int(seconds * rate), channels))
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(channels)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(samples.astype("<i2").tobytes())
    return out.getvalue()


@pytest.mark.parametrize("kind", ["wav-24k-mono", "wav-16k-stereo", "wav-44k-stereo", "opus"])
def test_the_child_decodes_the_samples_the_pod_decoded_itself(kind: str, tmp_path: Path) -> None:
    pcm = streams.random_speechlike(3.0, seed=4)
    if kind == "opus":
        sphn.write_opus(str(tmp_path / "a.opus"), pcm[None], 24_000)
        body = (tmp_path / "a.opus").read_bytes()
    else:
        rate = {"24k": 24_000, "16k": 16_000, "44k": 44_100}[kind.split("-")[1]]
        channels = pcm[None] if kind.endswith("mono") else np.stack([pcm, pcm[::-1]])
        body = _wav(sphn.resample(channels, 24_000, rate), rate, tmp_path / "a.wav")
    unbounded = audio.decode_audio_bytes(body)
    assert np.array_equal(asyncio.run(decoding.decode(body, ROOMY)), unbounded)


def test_opus_declaring_hours_is_refused_before_it_is_decoded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """3.2 KB of empty 120 ms packets declare 120 s; 1 MB would be ten hours."""
    bomb = oggfiles.opus_file([oggfiles.EMPTY_120_MS] * 1000, oggopus.MAX_PACKET)
    assert len(bomb) < 4000 and oggopus.stream_samples(bomb) == 1000 * oggopus.MAX_PACKET

    def never(*_: object) -> None:
        raise AssertionError("decoded")

    monkeypatch.setattr(sphn, "read_opus_bytes", never)
    with pytest.raises(audio.AudioTooLong, match=r"120\.0\+ s of audio, over the limit of 60 s"):
        audio.decode_audio_bytes(bomb, max_seconds=60.0)


def test_the_opus_count_is_what_the_decoder_gives(tmp_path: Path) -> None:
    """The count is never below the decoded length (so nothing decodes past it): the
    encoder's own packets and the hand-made empty ones."""
    sphn.write_opus(str(tmp_path / "a.opus"), streams.random_speechlike(5.0, seed=2)[None],
                    24_000)
    for body in ((tmp_path / "a.opus").read_bytes(),
                 oggfiles.opus_file([oggfiles.EMPTY_120_MS] * 300, oggopus.MAX_PACKET)):
        decoded, rate = sphn.read_opus_bytes(body)
        assert rate == oggopus.RATE
        assert oggopus.stream_samples(body) == np.asarray(decoded).shape[-1]


def test_a_file_is_decoded_no_further_than_the_limit() -> None:
    """60 s of 8-channel audio against a 10 s limit: refused from the first 11 s."""
    body = _multichannel_wav(60.0, 8, 48_000)
    with pytest.raises(audio.AudioTooLong, match=r"11\.0\+ s of audio, over the limit of 10 s"):
        audio.decode_audio_bytes(body, max_seconds=10.0)


def test_a_decode_over_its_memory_limit_is_413_and_the_same_file_decodes_with_room() -> None:
    body = _multichannel_wav(60.0, 8, 48_000)
    with pytest.raises(decoding.Refused) as refused:
        asyncio.run(decoding.decode(body, decoding.Limits(3600.0, 256 << 20, 60.0)))
    assert refused.value.status == 413
    assert "more than 256 MiB (decode_memory_bytes)" in refused.value.message
    pcm = asyncio.run(decoding.decode(body, decoding.Limits(3600.0, 1 << 30, 60.0)))
    assert abs(pcm.size - 60 * 24_000) < 1_000


def test_a_decode_past_its_deadline_is_413_and_leaves_no_child() -> None:
    body = _multichannel_wav(60.0, 8, 48_000)
    before = _children()
    with pytest.raises(decoding.Refused) as refused:
        asyncio.run(decoding.decode(body, decoding.Limits(3600.0, 1 << 30, 0.05)))
    assert (refused.value.status, refused.value.message) == (
        413, "the body took longer than 0.05 s to decode (decode_timeout_seconds)")
    assert _children() <= before


def test_a_decode_killed_midway_leaves_nothing_on_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rust aborts at the memory limit (every time: the first case left a file before)
    and the deadline kills: no cleanup runs in the child, so its copy of the body must
    not be a file (a pod's /tmp would fill up by an upload's size per refusal)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the child's temporary files
    body = _multichannel_wav(60.0, 8, 48_000)
    for limits, kind in ((decoding.Limits(3600.0, 256 << 20, 60.0), "memory_bytes"),
                         (decoding.Limits(3600.0, 1 << 30, 0.05), "timeout_seconds")):
        with pytest.raises(decoding.Refused, match=f"decode_{kind}"):
            asyncio.run(decoding.decode(body, limits))
    assert list(tmp_path.iterdir()) == []


def test_a_system_without_memfd_decodes_from_a_temporary_file_it_removes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = _multichannel_wav(2.0, 2, 48_000)
    decoded = audio.decode_audio_bytes(body, MAX_SECONDS)
    monkeypatch.delattr(os, "memfd_create")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    assert np.array_equal(audio.decode_audio_bytes(body, MAX_SECONDS), decoded)
    assert list(tmp_path.iterdir()) == []


def _children() -> set[str]:
    return {pid for path in Path("/proc/self/task").glob("*/children")
            for pid in path.read_text().split()}


def test_a_pod_refuses_an_opus_bomb_with_413_and_its_stream_goes_on(
        upload_server: servers.ServerProcess) -> None:
    """A stream in real time on the pod keeps its words while bombs arrive beside it."""
    bomb = oggfiles.opus_file([oggfiles.EMPTY_120_MS] * 6_000, oggopus.MAX_PACKET)  # 720 s
    pcm = streams.random_speechlike(4.0, seed=9)

    async def attack() -> list[tuple[int, str]]:
        url = upload_server.http_url
        return await asyncio.gather(*(asyncio.to_thread(servers.post_file, url, bomb)
                                      for _ in range(4)))

    async def both() -> tuple[list[tuple[int, str]], list[dict[str, object]]]:
        stream = asyncio.create_task(kyutai_client.transcribe(
            upload_server.ws_url, pcm, realtime=1.0, short=True, timeout=120))
        answers = await attack()
        return answers, await stream

    answers, transcript = asyncio.run(both())
    for status, text in answers:
        assert status == 413 and "over the limit of 600 s (max_upload_seconds)" in text, text
    assert not [m for m in transcript if m["type"] == "Error"]
    assert (transcript[-1]["type"], transcript[-1]["id"]) == ("Marker", 0)
    upload_server.wait_idle()


def test_a_pod_refuses_a_wav_over_the_limit_with_413(
        upload_server: servers.ServerProcess, tmp_path: Path) -> None:
    body = _wav(np.zeros((1, int(8_000 * (MAX_SECONDS + 2))), np.float32), 8_000,
                tmp_path / "long.wav")
    status, text = servers.post_file(upload_server.http_url, body)
    assert status == 413 and "over the limit of 600 s (max_upload_seconds)" in text, text
    assert upload_server.modules_info()["used_slots"] == 0


def test_a_post_whose_client_goes_away_frees_its_slot(
        upload_server: servers.ServerProcess, tmp_path: Path) -> None:
    """Ten minutes of audio would hold the slot for long after the client left."""
    body = _wav(np.zeros((1, int(24_000 * (MAX_SECONDS - 10))), np.float32), 24_000,
                tmp_path / "long.wav")
    host, port = upload_server.address.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", "/api/asr-streaming", body=body, headers=servers.UPLOAD_HEADERS)
    deadline = time.monotonic() + 30
    while upload_server.modules_info()["used_slots"] == 0:
        assert time.monotonic() < deadline, "the upload never took a slot"
        time.sleep(0.02)
    assert connection.sock is not None
    connection.sock.shutdown(socket.SHUT_RDWR)
    connection.close()
    upload_server.wait_idle(timeout=5)
    clip = _wav(streams.random_speechlike(3.0, seed=1)[None], 24_000, tmp_path / "clip.wav")
    # the pod serves the next one whole
    status, text = servers.post_file(upload_server.http_url, clip)
    assert status == 200 and '"Word"' in text, text


def _slow_post(server: servers.ServerProcess, pieces: list[bytes], pause: float) -> str:
    """A POST declaring 1 MB whose ``pieces`` come ``pause`` s apart; the answer."""
    host, port = server.address.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /api/asr-streaming HTTP/1.1\r\nHost: pod\r\n"
                     b"Content-Type: audio/wav\r\nContent-Length: 1000000\r\n\r\n")
        for piece in pieces:
            try:
                sock.sendall(piece)
            except OSError:  # refused meanwhile
                break
            time.sleep(pause)
        return _answer(sock)


def _answer(sock: socket.socket) -> str:
    """A whole HTTP answer: its head, then as many bytes as its content-length says."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or b"\r\n\r\n"
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length and (more := sock.recv(65536)):
        body += more
    return (head + b"\r\n\r\n" + body).decode(errors="replace")


def test_a_body_that_stops_coming_is_408(upload_server: servers.ServerProcess) -> None:
    answer = _slow_post(upload_server, [b"RIFF"], 0.0)
    assert answer.startswith("HTTP/1.1 408"), answer
    assert f"no body data for {BODY_TIMEOUT:g} s (body_timeout_seconds)" in answer
    assert upload_server.modules_info()["used_slots"] == 0


def test_a_body_trickling_under_the_minimum_pace_is_408(
        upload_server: servers.ServerProcess) -> None:
    answer = _slow_post(upload_server, [b"x" * 100] * 40, 0.25)
    assert answer.startswith("HTTP/1.1 408"), answer
    assert "under the minimum of 100000 (min_body_bytes_per_second)" in answer


def test_the_decoding_child_yields_the_cpu_to_the_pod() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; from asrpool.server import "
                           "decoding; decoding._behind_the_pod(); print(os.nice(0))"],
                          capture_output=True, text=True, check=True, timeout=60)
    assert int(done.stdout) == decoding.NICENESS > os.nice(0)


def test_the_decoding_child_is_the_first_the_oom_killer_takes() -> None:
    """Under a pod's memory limit the kernel kills the decoder, never the server."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "from asrpool.server import decoding; "
                           "decoding._first_to_go(); "
                           "print(open('/proc/self/oom_score_adj').read())"],
                          capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "1000"
