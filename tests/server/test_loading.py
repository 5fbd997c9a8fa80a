"""While the model loads, the pod listens but is not ready; a failed load exits 1.

The first test runs the app in-process (``create_app`` with an injected engine factory
that waits for the test), served by a real uvicorn on a loopback port.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from asrpool.common import processes, weights
from asrpool.server import app, engine, models, pods, settings
from tests.support import kyutai_client, servers


class _Gate:
    """An engine factory that builds the tiny engine only once the test opens the gate."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def __call__(self) -> engine.BatchedEngine:
        self.open.wait(60)
        return engine.BatchedEngine(models.load_model("tiny"), 1)


@pytest.fixture
def gated() -> Iterator[tuple[_Gate, str]]:
    gate = _Gate()
    port = processes.free_port()
    config = settings.ServerSettings(batch_size=1, host="127.0.0.1", port=port)
    server = uvicorn.Server(uvicorn.Config(
        app.create_app(config, pods.Deps(engine_factory=gate)), host="127.0.0.1", port=port,
        log_level="warning", ws="websockets-sansio"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    try:
        yield gate, f"127.0.0.1:{port}"
    finally:
        gate.open.set()
        server.should_exit = True
        thread.join(15)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_not_ready_while_loading(gated: tuple[_Gate, str]) -> None:
    gate, address = gated
    assert _status(f"http://{address}/readyz") == 503
    assert _status(f"http://{address}/startupz") == 503  # the startup probe waits
    assert _status(f"http://{address}/healthz") == 200
    async with await kyutai_client.connect(f"ws://{address}/api/asr-streaming") as ws:
        error = await kyutai_client.expect(ws, "Error")
        assert error["code"] == "busy"
    gate.open.set()
    deadline = time.monotonic() + 60
    while _status(f"http://{address}/readyz") != 200:
        assert time.monotonic() < deadline, "never became ready"
        await asyncio.sleep(0.05)
    assert _status(f"http://{address}/startupz") == 200
    async with await kyutai_client.connect(f"ws://{address}/api/asr-streaming") as ws:
        await kyutai_client.expect(ws, "Ready")


def test_a_model_that_cannot_load_exits_3_and_its_last_line_says_why(tmp_path: Path) -> None:
    """Exit 3 is ``weights.EXIT_MODEL_UNAVAILABLE``: the operator's ``ModelUnavailable``."""
    missing = tmp_path / "no-such-checkpoint"
    server = servers.ServerProcess(tmp_path, model=str(missing)).start()
    assert server.wait(120) == weights.EXIT_MODEL_UNAVAILABLE
    last = server.log().strip().splitlines()[-1]
    assert last == f"asrpool serve: checkpoint directory {missing} does not exist (or is not a" \
        " directory)"
