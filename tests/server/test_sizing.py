"""``serve --batch-size auto``: the pod measures its engine and serves what keeps real time
(``server.sizing``). The search is tested with chosen trial times; real pods measure
``tiny`` on this CPU and a paced engine from its file."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from asrpool.server import enginechild, pacing, sizing
from tests.support import kyutai_client, servers

H200 = Path(__file__).resolve().parents[2] / "bench/results/capacity-stt-1b-en_fr-cuda.json"


def _linear(ms_per_slot: float, base_ms: float = 2.0, fits_below: int | None = None
            ) -> tuple[Callable[[int], float | None], list[int]]:
    """A trial whose step grows by ``ms_per_slot``, and the batches it was asked for."""
    tried: list[int] = []

    def trial(batch: int) -> float | None:
        tried.append(batch)
        if fits_below is not None and batch >= fits_below:
            return None
        return base_ms + ms_per_slot * batch

    return trial, tried


def test_the_search_finds_the_largest_batch_within_the_budget_closely() -> None:
    trial, tried = _linear(0.2)  # within 64 ms up to 310 slots
    chosen = sizing.search(trial, 64.0, 4096, time.monotonic() + 60)
    assert 310 - 310 * sizing.RESOLUTION <= chosen.slots <= 310
    assert chosen.bound == "latency" and chosen.step_p99_ms <= 64.0
    assert tried[:10] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert [batch for batch, _ in chosen.trials] == tried


def test_the_search_stops_at_memory_and_at_the_largest_batch_asked() -> None:
    trial, _ = _linear(0.01, fits_below=100)
    chosen = sizing.search(trial, 64.0, 4096, time.monotonic() + 60)
    assert chosen.bound == "memory" and 100 - 100 * sizing.RESOLUTION <= chosen.slots < 100
    trial, _ = _linear(0.01)
    assert sizing.search(trial, 64.0, 48, time.monotonic() + 60).slots == 48


def test_the_search_serves_what_passed_when_its_time_is_up() -> None:
    trial, tried = _linear(0.01)
    chosen = sizing.search(trial, 64.0, 4096, time.monotonic() - 1)
    assert (chosen.slots, chosen.bound, tried) == (1, "time", [1])


def test_a_device_where_one_slot_misses_the_budget_is_no_pod() -> None:
    trial, _ = _linear(0.0, base_ms=95.25)
    with pytest.raises(sizing.TooSlow, match=r"one slot's step takes 95\.2 ms .* over the 64 "
                                             r"ms budget of an 80 ms frame"):
        sizing.search(trial, 64.0, 4096, time.monotonic() + 60)
    trial, _ = _linear(0.0, fits_below=1)
    with pytest.raises(sizing.TooSlow, match="does not fit in the device's memory"):
        sizing.search(trial, 64.0, 4096, time.monotonic() + 60)


def test_a_paced_engine_is_sized_from_its_file() -> None:
    points = pacing.read_profile(H200).points
    chosen = sizing.measure(_paced_spec(), 60.0, 4096, 60.0)
    assert chosen.bound == "profile" and chosen.step_p99_ms <= 60.0
    assert pacing.step_ms(points, chosen.slots + 1) > 60.0
    assert sizing.measure(_paced_spec(), 60.0, 64, 60.0).slots == 64


def _paced_spec() -> enginechild.EngineSpec:
    return enginechild.EngineSpec("stt-1b-en_fr", 1, paced_engine=str(H200))


async def test_a_pod_with_auto_measures_its_engine_and_serves_that_many_slots(
        tmp_path: Path) -> None:
    args = ["--batch-size", "auto", "--auto-max-batch", "4", "--auto-seconds", "60"]
    with servers.ServerProcess(tmp_path, args=args) as server:
        server.wait_ready(timeout=180)
        module = server.modules_info()
        assert module["total_slots"] == 4  # tiny steps 4 slots in far less than 64 ms
        assert module["auto_batch_size"].startswith("4 slots measured (p99 step ")
        assert module["auto_batch_size"].endswith("bound by max_batch)")
        step = server.metric("asr_auto_batch_step_p99_seconds")
        assert step is not None and 0 < step <= 0.064
        async with await kyutai_client.connect(server.ws_url) as ws:
            await kyutai_client.expect(ws, "Ready")
    assert "ready: model tiny, 4 slots (--batch-size auto: 4 slots measured" in server.log()


def test_a_pod_whose_one_slot_misses_the_budget_exits_saying_both(tmp_path: Path) -> None:
    args = ["--batch-size", "auto", "--auto-step-budget-ms", "0.01"]
    with servers.ServerProcess(tmp_path, args=args) as server:
        assert server.wait(180) == 1
    last = server.log().strip().splitlines()[-1]
    assert last.startswith("asrpool serve: --batch-size auto: one slot's step takes ")
    assert "over the 0.01 ms budget of an 80 ms frame" in last


def test_a_paced_pod_with_auto_reads_its_file(tmp_path: Path) -> None:
    args = ["--paced-engine", str(H200), "--batch-size", "auto", "--auto-max-batch", "16"]
    with servers.ServerProcess(tmp_path, args=args) as server:
        server.wait_ready()
        assert server.modules_info()["total_slots"] == 16


def test_a_pinned_batch_whose_state_is_more_than_the_free_memory_is_refused_with_both() -> None:
    from asrpool.server import models

    model = models.load_model("tiny")
    per_slot = sizing.state_bytes_per_slot(model)
    sizing.check_fits(model, 100, available=100 * per_slot)  # it fits exactly
    with pytest.raises(sizing.DoesNotFit) as refused:
        sizing.check_fits(model, 100, available=40 * per_slot + 7)
    kib = per_slot / 1024
    assert str(refused.value).startswith(
        f"--batch-size 100 needs {100 * kib / 1024:.1f} MiB of streaming state ({kib:.1f} KiB "
        f"a slot), over the {40 * kib / 1024:.1f} MiB the machine has free: at most 40 slots")
    assert sizing.memory_available(model.device) > 0
