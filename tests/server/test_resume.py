"""Resume: a dropped connection comes back with its token and the stream goes on."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
from websockets.asyncio import client as ws_client

from tests.server import conftest, reference
from tests.support import kyutai_client, servers

GRACE = 3.0
SECOND = 24_000
RESUMABLE = {"asrpool-resumable": "1"}  # a direct client asks to be kept after a drop


@pytest.fixture(scope="module", params=["loop", "intake"])
def resume_server(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerProcess]:
    """Streams' messages read on the pod's loop, then in intake processes."""
    workdir = tmp_path_factory.mktemp("resume")
    with servers.ServerProcess(workdir, batch_size=conftest.BATCH, args=[
            "--resume-grace-seconds", str(GRACE), *conftest.intake_args(request.param)]) as server:
        server.wait_ready()
        yield server


@pytest.fixture(autouse=True)
def _idle(resume_server: servers.ServerProcess) -> None:
    resume_server.wait_idle()  # each test counts slots: start with none used


async def _send_samples(ws: ws_client.ClientConnection, samples: np.ndarray) -> None:
    for start in range(0, len(samples), 1920):
        await ws.send(kyutai_client.audio(samples[start:start + 1920]))


def _drop(ws: ws_client.ClientConnection) -> None:
    """Lose the connection without a close frame, as a network failure would."""
    ws.transport.abort()


async def test_resume_continues_with_context_intact(
        resume_server: servers.ServerProcess) -> None:
    pcm = conftest.speechlike(4.0, seed=3)
    silence = np.zeros(SECOND, dtype=np.float32)
    stream = np.concatenate([silence, pcm, *[silence] * 5])  # what precedes marker 0
    first, second = 3 * SECOND, 4 * SECOND
    received: list[dict[str, object]] = []

    ws = await kyutai_client.connect(resume_server.ws_url, RESUMABLE)
    await kyutai_client.expect(ws, "Ready")
    assert ws.response is not None
    token = ws.response.headers["asrpool-resume-token"]
    session = ws.response.headers["asrpool-session-id"]
    await _send_samples(ws, stream[:first])
    await ws.send(kyutai_client.marker(1))
    await _send_samples(ws, stream[first:second])
    received += await kyutai_client.until_marker(ws, 1)
    await _send_samples(ws, stream[second:second + 2 * SECOND])  # then the line drops
    _drop(ws)
    await asyncio.sleep(0.5)  # the pod keeps working through what it had buffered
    assert resume_server.modules_info()["used_slots"] == 1

    headers = {"asrpool-resume-token": token, "asrpool-resume-received": str(len(received))}
    async with await kyutai_client.connect(resume_server.ws_url, headers) as again:
        await kyutai_client.expect(again, "Ready")
        assert again.response is not None
        assert again.response.headers["asrpool-session-id"] == session
        offset = int(again.response.headers["asrpool-resume-offset"])
        assert second <= offset <= second + 2 * SECOND
        await _send_samples(again, stream[offset:])
        await again.send(kyutai_client.marker(0))
        for _ in range(10):
            await again.send(kyutai_client.audio(silence))
        received += await kyutai_client.until_marker(again, 0)

    got = kyutai_client.words(received)
    assert got == reference.file_words(pcm, conftest.BATCH)
    assert len(got) > 6


async def test_unclaimed_slot_is_freed_after_the_grace_period(
        resume_server: servers.ServerProcess) -> None:
    ws = await kyutai_client.connect(resume_server.ws_url, RESUMABLE)
    await kyutai_client.expect(ws, "Ready")
    assert ws.response is not None
    token = ws.response.headers["asrpool-resume-token"]
    await _send_samples(ws, np.zeros(SECOND, dtype=np.float32))
    _drop(ws)
    await asyncio.sleep(0.3)
    assert resume_server.modules_info()["used_slots"] == 1  # held for a resume
    deadline = asyncio.get_running_loop().time() + GRACE + 10
    while resume_server.modules_info()["used_slots"]:
        assert asyncio.get_running_loop().time() < deadline, "slot never freed"
        await asyncio.sleep(0.1)
    async with await kyutai_client.connect(
            resume_server.ws_url, {"asrpool-resume-token": token}) as late:
        error = await kyutai_client.expect(late, "Error")
        assert error["code"] == "bad_resume_token"


async def test_unknown_resume_token(resume_server: servers.ServerProcess) -> None:
    async with await kyutai_client.connect(
            resume_server.ws_url, {"asrpool-resume-token": "no-such-token"}) as ws:
        error = await kyutai_client.expect(ws, "Error")
        assert error["code"] == "bad_resume_token"
        await asyncio.wait_for(ws.wait_closed(), 10)


async def test_a_clean_close_ends_the_stream_at_once(
        resume_server: servers.ServerProcess) -> None:
    async with await kyutai_client.connect(resume_server.ws_url) as ws:
        await kyutai_client.expect(ws, "Ready")
        assert ws.response is not None
        token = ws.response.headers["asrpool-resume-token"]
    deadline = asyncio.get_running_loop().time() + 10
    while resume_server.modules_info()["used_slots"]:
        assert asyncio.get_running_loop().time() < deadline, "slot never freed"
        await asyncio.sleep(0.05)
    async with await kyutai_client.connect(
            resume_server.ws_url, {"asrpool-resume-token": token}) as late:
        assert (await kyutai_client.expect(late, "Error"))["code"] == "bad_resume_token"


async def test_a_resume_takes_over_a_connection_not_yet_seen_dead(
        resume_server: servers.ServerProcess) -> None:
    async with await kyutai_client.connect(resume_server.ws_url, RESUMABLE) as old:
        await kyutai_client.expect(old, "Ready")
        assert old.response is not None
        token = old.response.headers["asrpool-resume-token"]
        session = old.response.headers["asrpool-session-id"]
        async with await kyutai_client.connect(
                resume_server.ws_url, {"asrpool-resume-token": token}) as new:
            await kyutai_client.expect(new, "Ready")
            assert new.response is not None
            assert new.response.headers["asrpool-session-id"] == session
            await asyncio.wait_for(old.wait_closed(), 10)  # the old connection is let go
            await new.send(kyutai_client.audio(np.zeros(SECOND, dtype=np.float32)))
            await new.send(kyutai_client.marker(4))
            await new.send(kyutai_client.audio(np.zeros(SECOND, dtype=np.float32)))
            await kyutai_client.until_marker(new, 4)
        resume_server.wait_idle(10)  # one slot all along, freed by the clean close


def _end(server: servers.ServerProcess, token: str) -> int:
    """DELETE /api/asr-streaming for the stream ``token`` names: the HTTP status."""
    request = urllib.request.Request(server.http_url + "/api/asr-streaming", method="DELETE",
                                     headers={"asrpool-resume-token": token})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_a_stream_asked_to_end_frees_its_slot_attached_or_kept(
        resume_server: servers.ServerProcess) -> None:
    """What a router asks when its client closed but the pod had not read the close:
    the stream its resume token names ends now, attached or kept for a resume."""
    attached = await kyutai_client.connect(resume_server.ws_url, RESUMABLE)
    kept = await kyutai_client.connect(resume_server.ws_url, RESUMABLE)
    tokens = []
    for ws in (attached, kept):
        await kyutai_client.expect(ws, "Ready")
        assert ws.response is not None
        tokens.append(ws.response.headers["asrpool-resume-token"])
    _drop(kept)
    await asyncio.sleep(0.5)
    assert resume_server.modules_info()["used_slots"] == 2  # kept for the grace
    assert [await asyncio.to_thread(_end, resume_server, t) for t in tokens] == [204, 204]
    await asyncio.wait_for(attached.wait_closed(), 10)
    assert resume_server.modules_info()["used_slots"] == 0
    assert await asyncio.to_thread(_end, resume_server, tokens[0]) == 404

