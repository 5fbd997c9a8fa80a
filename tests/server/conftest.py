"""Fixtures of the server suite: real ``asrpool serve`` processes with the tiny model."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from tests.support import servers

BATCH = 2


@pytest.fixture(scope="module", params=["loop", "intake"])
def shared_server(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerProcess]:
    """One server for tests that each use their own streams (B=2, short idle timeout),
    its streams' messages read on its event loop, then in two intake processes: every
    test of it holds both ways."""
    workdir = tmp_path_factory.mktemp("server")
    intake = intake_args(request.param)
    with servers.ServerProcess(workdir, batch_size=BATCH, args=[
        "--idle-timeout-seconds", "1.5", "--max-message-bytes", "262144",
        "--resume-grace-seconds", "0", *intake,
    ]) as server:
        server.wait_ready()
        yield server


def intake_args(where: str) -> list[str]:
    """A pod's flags for where its streams' messages are read: "loop" or "intake"."""
    return ["--intake-workers", "2"] if where == "intake" else []


@pytest.fixture
def idle_server(shared_server: servers.ServerProcess) -> servers.ServerProcess:
    """The shared server once the previous test's streams have freed their slots."""
    shared_server.wait_idle()
    return shared_server


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """Deterministic audio with structure (noise bursts and tones), float32 at 24 kHz."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 24_000)
    t = np.arange(n) / 24_000
    envelope = (np.sin(2 * np.pi * 1.7 * t) > 0).astype(np.float32)
    tone = np.sin(2 * np.pi * (150 + 100 * np.sin(2 * np.pi * 0.3 * t)) * t)
    return ((0.2 * rng.standard_normal(n) + 0.3 * tone) * envelope).astype(np.float32)
