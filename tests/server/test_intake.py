"""A pod with intake processes (``--intake-workers``): the streams' messages are read,
checked and answered in child processes, the pod keeps the streams."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import numpy as np
import pytest

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
