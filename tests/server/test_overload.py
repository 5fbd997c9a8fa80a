"""A pod that falls behind real time stops admitting, sheds its newest streams past a hard
bound (where that helps), and recovers by itself (``server.overload``, ``pods.Pod``).

The first tests feed :class:`overload.RealTimeWatch` step deliveries and loop ticks at
chosen times; the last runs a real pod whose paced engine steps in 160 ms (twice a
frame's duration, a device given too many slots) under real websocket clients that send
in real time."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from websockets.asyncio import client as ws_client

from asrpool.common import protocol
from asrpool.server import overload
from tests.support import kyutai_client, servers

FRAME = protocol.FRAME_SIZE
H200 = Path(__file__).resolve().parents[2] / "bench/results/capacity-stt-1b-en_fr-cuda.json"


def _steps(watch: overload.RealTimeWatch, start: float, interval: float, count: int,
           backlog: bool = True, streams: int = 16,
           engine_s: float = 0.03) -> list[overload.Verdict]:
    """Steps delivered every ``interval``, each of which took the engine ``engine_s``
    (the rest of the interval is the host's: hand-over, intake, the event loop)."""
    buffered = {0: FRAME if backlog else FRAME // 2, 1: 0}
    return [watch.step(start + i * interval, buffered, engine_s, streams)
            for i in range(count)]


def test_steps_that_keep_real_time_never_fall_behind() -> None:
    watch = overload.RealTimeWatch(admit_seconds=1.0, shed_seconds=5.0)
    verdicts = _steps(watch, 0.0, 0.079, 500)  # busy without a break, each step in time
    assert watch.behind == 0.0 and not watch.overloaded
    assert not any(v.overloaded_changed or v.shed for v in verdicts)


def test_slow_steps_with_no_frame_waiting_are_no_lag() -> None:
    """A lone stream's frame every 200 ms (a client slower than real time) waits for none."""
    watch = overload.RealTimeWatch(admit_seconds=1.0, shed_seconds=5.0)
    _steps(watch, 0.0, 0.2, 100, backlog=False)
    assert watch.behind == 0.0


def test_busy_slow_steps_fall_behind_overload_then_shed_and_recover() -> None:
    watch = overload.RealTimeWatch(admit_seconds=1.0, shed_seconds=2.0)
    # 160 ms steps, busy: each puts every stream 80 ms further behind.
    verdicts = _steps(watch, 0.0, 0.16, 14)  # 13 intervals: 1.04 s behind
    assert watch.engine_behind == pytest.approx(13 * 0.08)
    assert watch.overloaded and [v.overloaded_changed for v in verdicts].count(True) == 1
    verdicts = _steps(watch, 14 * 0.16, 0.16, 20, streams=40)  # 2.6 s behind
    sheds = [v.shed for v in verdicts if v.shed]
    assert sheds and sheds[0] == 3  # a sixteenth of 40, rounded up
    # At most once a second: 20 steps of 160 ms from 2 s behind leave room for two.
    assert len(sheds) <= 2
    # Steps in 40 ms from now: catching up 40 ms a step, shedding nothing more.
    start = 34 * 0.16
    verdicts = _steps(watch, start, 0.04, 40)
    assert not any(v.shed for v in verdicts)
    assert watch.overloaded  # still over half the bound behind
    verdicts = _steps(watch, start + 40 * 0.04, 0.04, 1, backlog=False)  # all caught up
    assert watch.behind == 0.0 and not watch.overloaded and verdicts[0].overloaded_changed


def test_an_engine_whose_own_step_is_over_a_frame_refuses_but_sheds_nothing() -> None:
    """Its step computes every row, busy or not: fewer streams would not make it faster."""
    watch = overload.RealTimeWatch(admit_seconds=1.0, shed_seconds=2.0)
    verdicts = _steps(watch, 0.0, 0.16, 100, engine_s=0.15)
    assert watch.engine_bound and watch.overloaded and watch.behind > 7
    assert not any(v.shed for v in verdicts)


def test_no_shedding_or_refusing_when_switched_off() -> None:
    watch = overload.RealTimeWatch(admit_seconds=0.0, shed_seconds=0.0)
    verdicts = _steps(watch, 0.0, 0.5, 100)
    assert watch.behind > 40 and not watch.overloaded
    assert not any(v.shed or v.overloaded_changed for v in verdicts)


def test_a_saturated_event_loop_with_audio_waiting_falls_behind() -> None:
    watch = overload.RealTimeWatch(admit_seconds=1.0, shed_seconds=5.0)
    now, cpu = 0.0, 0.0
    for _ in range(3):  # saturated, with steps leaving frames behind (audio read late)
        watch.step(now, {0: FRAME}, 0.01, 4)
        watch.tick(now, cpu, 4)
        now, cpu = now + 0.5, cpu + 0.49
    assert watch.loop_behind == pytest.approx(1.0) and watch.overloaded
    watch.step(now, {0: 0}, 0.01, 4)  # a step leaves no frame: the audio flows again
    watch.tick(now, cpu + 0.49, 4)
    watch.tick(now + 0.5, cpu + 0.98, 4)
    assert watch.loop_behind == 0.0


def test_a_busy_loop_while_audio_flows_is_not_behind() -> None:
    """One client flooding the loop with messages is not the pod falling behind."""
    watch = overload.RealTimeWatch(admit_seconds=1.0, shed_seconds=5.0)
    for i in range(10):
        watch.step(i * 0.5, {0: 0}, 0.01, 4)
        watch.tick(i * 0.5, i * 0.5, 4)  # 100 % busy
    assert watch.behind == 0.0


def test_an_idle_engine_is_not_behind() -> None:
    watch = overload.RealTimeWatch(admit_seconds=1.0, shed_seconds=5.0)
    _steps(watch, 0.0, 0.2, 10)
    assert watch.engine_behind > 1.0
    watch.tick(1.8 + overload.IDLE_AFTER_S + 0.1, 0.0, 0)  # no step since: nothing waits
    assert watch.behind == 0.0 and not watch.overloaded


def _slow_profile(tmp_path: Path) -> Path:
    """The committed H200 stt-1b-en_fr result, its 4-slot batch timed at 160 ms."""
    data = json.loads(H200.read_text())
    data["batches"] = [{"batch_size": 4, "engine_p50_ms": 160.0}]
    path = tmp_path / "slow-capacity.json"
    path.write_text(json.dumps(data))
    return path


async def _stream_in_real_time(ws: ws_client.ClientConnection, stop: asyncio.Event) -> None:
    silence = kyutai_client.audio(np.zeros(FRAME, dtype=np.float32))
    loop = asyncio.get_running_loop()
    started, sent = loop.time(), 0
    while not stop.is_set():
        await ws.send(silence)
        sent += 1
        await asyncio.sleep(max(0.0, started + sent * 0.08 - loop.time()))


async def test_a_pod_whose_engine_is_too_slow_refuses_new_streams_and_recovers(
        tmp_path: Path) -> None:
    """The paced step alone is 160 ms: every stream falls behind whatever the pod does,
    so it admits no new one and says why, cuts none, and takes streams again once its
    clients are gone."""
    args = ["--paced-engine", str(_slow_profile(tmp_path)), "--overload-seconds", "0.5",
            "--shed-seconds", "1"]
    with servers.ServerProcess(tmp_path, batch_size=4, args=args) as server:
        server.wait_ready()
        stop = asyncio.Event()
        async with await kyutai_client.connect(server.ws_url) as older, \
                await kyutai_client.connect(server.ws_url) as newer:
            for ws in (older, newer):
                await kyutai_client.expect(ws, "Ready")
            senders = [asyncio.create_task(_stream_in_real_time(ws, stop))
                       for ws in (older, newer)]
            try:
                await _until(lambda: server.modules_info()["overloaded"] == "true")
                assert server.metric("asr_overloaded") == 1
                async with await kyutai_client.connect(server.ws_url) as refused:
                    error = await kyutai_client.next_error(refused)
                assert error["code"] == "busy" and "behind real time" in error["message"]
                await asyncio.sleep(2.5)  # past the shed bound, and still further behind
                assert (older.close_code, newer.close_code) == (None, None)
                assert not any(task.done() for task in senders)
            finally:
                stop.set()
                for task in senders:
                    task.cancel()
                await asyncio.gather(*senders, return_exceptions=True)
        # Its streams gone, nothing waits: it takes streams again.
        await _until(lambda: server.modules_info()["overloaded"] == "false")
        assert server.metric("asr_overloaded") == 0
        assert not server.metric("asr_shed_streams_total")
        async with await kyutai_client.connect(server.ws_url) as again:
            await kyutai_client.expect(again, "Ready")
    log = server.log()
    # The step as measured: the paced 160 ms and whatever a loaded machine adds.
    took = re.search(r"the engine's own step takes (\d+) ms for 4 slots", log)
    assert "overloaded:" in log and took is not None and int(took[1]) >= 160, log
    assert "shedding the" not in log and "caught up with real time" in log


async def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)
