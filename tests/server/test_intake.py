"""A pod with intake processes (``--intake-workers``): the streams' messages are read,
checked and answered in child processes, the pod keeps the streams."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.asyncio import client as ws_client
from websockets.exceptions import ConnectionClosed

from asrpool.common import processes
from tests.server import conftest, test_fast_paths
from tests.support import kyutai_client, servers

FRAME = kyutai_client.FRAME_SIZE


@pytest.fixture(scope="module")
def intake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerProcess]:
    workdir = tmp_path_factory.mktemp("intake")
    with servers.ServerProcess(workdir, batch_size=conftest.BATCH, args=[
        "--intake-workers", "2", "--idle-timeout-seconds", "1.5",
        "--max-message-bytes", "262144", "--resume-grace-seconds", "0",
    ]) as server:
        server.wait_ready()
        yield server


async def test_a_burst_of_audio_and_markers_gets_the_engines_results_in_order(
        intake_server: servers.ServerProcess) -> None:
    intake_server.wait_idle()
    messages = test_fast_paths._burst(6.0, seed=31)
    async with await kyutai_client.connect(intake_server.ws_url) as ws:
        await kyutai_client.expect(ws, "Ready")
        for message in messages:
            await ws.send(kyutai_client.pack(message))
        got = await kyutai_client.until_marker(ws, test_fast_paths.LAST, timeout=120)
    expected = test_fast_paths._reference(messages)
    shown = test_fast_paths._shown
    assert [shown(m) for m in got] == [shown(m) for m in expected]


def _intake_pids(server: servers.ServerProcess) -> set[int]:
    pids = set()
    for pid in processes.descendants(server.pid):
        with contextlib.suppress(OSError):
            if b"asrpool.server.intakeworker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.add(pid)
    return pids


async def _words_go_on(ws: ws_client.ClientConnection, marker_id: int) -> None:
    """The stream still answers: audio and a marker in, the marker back."""
    await ws.send(kyutai_client.audio(conftest.speechlike(0.5, seed=marker_id)))
    await ws.send(kyutai_client.marker(marker_id))
    for _ in range(8):
        await ws.send(kyutai_client.audio(np.zeros(FRAME, dtype=np.float32)))
    await kyutai_client.until_marker(ws, marker_id, timeout=60)


async def test_a_dead_intake_process_ends_its_streams_only_and_another_takes_its_place(
        intake_server: servers.ServerProcess) -> None:
    intake_server.wait_idle()
    before = _intake_pids(intake_server)
    assert len(before) == 2
    async with await kyutai_client.connect(intake_server.ws_url) as first, \
            await kyutai_client.connect(intake_server.ws_url) as second:
        for ws in (first, second):  # one stream in each process (the least busy takes it)
            await kyutai_client.expect(ws, "Ready")
            await _words_go_on(ws, 1)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        ended = await asyncio.gather(*(_ended_or_alive(ws) for ws in (first, second)))
    told = [error for error in ended if error is not None]
    assert len(told) == 1, ended
    assert told[0]["code"] == "internal" and "intake process" in told[0]["message"]
    processes.wait_until(lambda: len(_intake_pids(intake_server)) == 2, 30, "a new intake")
    after = _intake_pids(intake_server)
    assert victim not in after
    assert intake_server.metric("asr_intake_restarts_total") == 1
    intake_server.wait_idle()
    async with await kyutai_client.connect(intake_server.ws_url) as ws:  # new streams are served
        await kyutai_client.expect(ws, "Ready")
        await _words_go_on(ws, 3)


async def _ended_or_alive(ws: ws_client.ClientConnection) -> dict[str, Any] | None:
    """The stream's Error if its intake process was the one killed; None if it goes on."""
    with contextlib.suppress(ConnectionClosed):  # the Error waits in the receive queue
        await ws.send(kyutai_client.audio(conftest.speechlike(0.5, seed=2)))
        await ws.send(kyutai_client.marker(2))
        for _ in range(8):
            await ws.send(kyutai_client.audio(np.zeros(FRAME, dtype=np.float32)))
    while True:
        message = await kyutai_client.receive(ws, 60)
        if message["type"] == "Error":
            with contextlib.suppress(ConnectionClosed, asyncio.TimeoutError):
                await asyncio.wait_for(ws.recv(), 5)
            assert ws.close_code == 1011
            return message
        if message["type"] == "Marker" and message["id"] == 2:
            return None
