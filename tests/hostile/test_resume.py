"""Resume never leaks a slot: malformed headers, racing resumes with one token."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
from websockets import exceptions as ws_exceptions
from websockets import protocol as ws_protocol
from websockets.asyncio import client as ws_client

from tests.support import kyutai_client, servers

GRACE = 2.0
RESUMABLE = {"asrpool-resumable": "1"}


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerProcess]:
    workdir = tmp_path_factory.mktemp("hostile-resume")
    with servers.ServerProcess(workdir, batch_size=2, args=[
            "--resume-grace-seconds", str(GRACE)]) as server:
        server.wait_ready()
        yield server


@pytest.fixture(autouse=True)
def _idle(pod: servers.ServerProcess) -> None:
    pod.wait_idle(timeout=GRACE + 20)


async def _held_stream(pod: servers.ServerProcess) -> str:
    """A stream whose connection dropped: held for its grace; its resume token."""
    ws = await kyutai_client.connect(pod.ws_url, RESUMABLE)
    await kyutai_client.expect(ws, "Ready")
    assert ws.response is not None
    await ws.send(kyutai_client.audio(np.zeros(1920, dtype=np.float32)))
    ws.transport.abort()
    await asyncio.sleep(0.3)
    assert pod.modules_info()["used_slots"] == 1
    return ws.response.headers["asrpool-resume-token"]


async def _wait_free(pod: servers.ServerProcess, within: float) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while pod.modules_info()["used_slots"]:
        assert asyncio.get_running_loop().time() < deadline, "the slot leaked"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("received", ["\u00b2", "9" * 5000, "-1", "1e3", "+4"])
async def test_a_malformed_received_count_is_refused_and_leaks_nothing(
        pod: servers.ServerProcess, received: str) -> None:
    token = await _held_stream(pod)
    headers = {"asrpool-resume-token": token, "asrpool-resume-received": received}
    with pytest.raises(ws_exceptions.InvalidStatus) as info:
        await kyutai_client.connect(pod.ws_url, headers)
    assert info.value.response.status_code == 400
    assert b"asrpool-resume-received" in info.value.response.body
    async with await kyutai_client.connect(pod.ws_url, {"asrpool-resume-token": token}) as ws:
        await kyutai_client.expect(ws, "Ready")  # still held, still resumable
    await _wait_free(pod, within=5)  # a clean close frees it at once


async def _resume(pod: servers.ServerProcess, token: str) -> ws_client.ClientConnection | None:
    with contextlib.suppress(ws_exceptions.WebSocketException, OSError):
        ws = await kyutai_client.connect(pod.ws_url, {"asrpool-resume-token": token})
        await kyutai_client.expect(ws, "Ready")
        return ws
    return None


async def _drain(ws: ws_client.ClientConnection) -> None:
    """Read (and drop) whatever comes until the connection closes: a replaced connection
    may get some of the stream's results before its close frame."""
    with contextlib.suppress(ws_exceptions.ConnectionClosed):
        while True:
            await ws.recv()


async def _open_ones(opened: list[ws_client.ClientConnection],
                     within: float) -> list[ws_client.ClientConnection]:
    """The connections still open once at most one is, or once ``within`` seconds have
    passed: judged by what happened to them (a replaced one gets its close frame, which
    can take seconds on a loaded machine), never by a short window."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        still = [ws for ws in opened if ws.state is ws_protocol.State.OPEN]
        if len(still) <= 1 or loop.time() > deadline:
            return still
        await asyncio.sleep(0.1)


async def test_resumes_racing_with_one_token_attach_once(pod: servers.ServerProcess) -> None:
    """Six resumes with one token at once, five times over: each time exactly one
    connection stays attached (the others are replaced), and it is the stream's."""
    for _ in range(5):
        token = await _held_stream(pod)
        both = await asyncio.gather(*(_resume(pod, token) for _ in range(6)))
        opened = [ws for ws in both if ws is not None]
        drains = [asyncio.create_task(_drain(ws)) for ws in opened]
        alive = await _open_ones(opened, within=30)
        assert len(alive) == 1, f"{len(alive)} connections attached to one stream"
        assert pod.metric("asr_open_channels") == 1
        survivor = drains[opened.index(alive[0])]
        survivor.cancel()  # recv() may be cancelled: the stream's messages stay queued
        await asyncio.gather(survivor, return_exceptions=True)
        await alive[0].send(kyutai_client.marker(7))
        await alive[0].send(kyutai_client.audio(np.zeros(1920 * 8, dtype=np.float32)))
        await kyutai_client.until_marker(alive[0], 7)
        for ws in opened:
            await ws.close()
        await asyncio.gather(*drains, return_exceptions=True)
        await _wait_free(pod, within=5)
