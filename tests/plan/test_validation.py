"""The simulator against the real platform: the same 40 sessions through
``LocalPlatform`` (Redis, 3 ``asrpool serve`` pods of the tiny model, the router with
its waiting room) and through the simulation give the same admitted, queued and
refused counts.

The scenario comes in four waves: six streams fill the six slots, then three or four
more wait; as many as there are short streams get a slot after about 1.2 s, the rest
are refused at the 2.5 s queue timeout. Every decision has a margin of a second or
more, because the real system's clocks are not exact: a freed slot shows in Redis up
to a heartbeat (0.5 s) later and waiters poll every 0.1 s. A test checks that the
simulated counts hold with the stream ends up to 1.2 s late, so the real run is not
on a knife edge.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from asrpool.client import local
from asrpool.common.processes import free_port
from asrpool.plan import simulating
from tests.plan.support import pool, replay
from tests.support import kyutai_client

PODS, SLOTS_PER_POD, QUEUE_TIMEOUT = 3, 2, 2.5
WAITED = 0.6  # seconds: an admission this much after the request came through the queue
WAVES = [(2, 4), (3, 4), (1, 3), (2, 3)]  # (short streams, waiters) per wave


def scenario() -> list[tuple[float, float]]:
    """40 sessions (start, duration), in start order."""
    sessions = []
    for k, (short, waiters) in enumerate(WAVES):
        at = 1.0 + 8.0 * k
        sessions += [(round(at + 0.1 * i, 2), 2.0 if i < short else 6.0) for i in range(6)]
        sessions += [(round(at + 0.8 + 0.1 * i, 2), 2.0) for i in range(waiters)]
    return [*sessions, (34.0, 2.0), (34.5, 2.0)]


def simulated(late: float = 0.0) -> tuple[int, int, int]:
    plan = simulating.Plan(pool(slots_per_pod=SLOTS_PER_POD, pods=PODS), policy="pack",
                           queue_timeout_seconds=QUEUE_TIMEOUT)
    c = replay(plan, [(start, duration + late) for start, duration in scenario()]).counts
    return c.admitted, c.queued, c.refused


def test_the_scenario_has_margins() -> None:
    assert len(scenario()) == 40
    assert simulated() == (34, 14, 6)
    assert all(simulated(late) == simulated() for late in (0.3, 0.6, 0.9, 1.2))


async def _session(url: str, start: float, duration: float, t0: float) -> str:
    """One client: connect at its start time, stream silence for its duration, close."""
    await asyncio.sleep(max(0.0, t0 + start - time.monotonic()))
    began = time.monotonic()
    async with await kyutai_client.connect(url) as ws:
        first = await kyutai_client.receive(ws, timeout=30)
        waited = time.monotonic() - began
        if first["type"] == "Error":
            assert first.get("code") == "busy", first
            return "refused"
        assert first["type"] == "Ready", first
        half_second = np.zeros(kyutai_client.SAMPLE_RATE // 2, dtype=np.float32)
        end = time.monotonic() + duration
        while (left := end - time.monotonic()) > 0:
            await ws.send(kyutai_client.audio(half_second))
            await asyncio.sleep(min(0.5, left))
    return "waited" if waited > WAITED else "at once"


async def _real_run(url: str) -> list[str]:
    t0 = time.monotonic() + 1.0
    return list(await asyncio.gather(*(_session(url, s, d, t0) for s, d in scenario())))


@pytest.mark.timeout(240)
def test_the_simulator_counts_what_the_real_platform_does() -> None:
    platform = local.LocalPlatform(PODS, SLOTS_PER_POD, "tiny", free_port(), policy="pack",
                                   queue_timeout_seconds=QUEUE_TIMEOUT)
    with platform:
        outcomes = asyncio.run(_real_run(platform.router_url + "/api/asr-streaming"))
    admitted = outcomes.count("at once") + outcomes.count("waited")
    queued = outcomes.count("waited") + outcomes.count("refused")  # every refusal waited
    assert (admitted, queued, outcomes.count("refused")) == simulated()
