"""``asrpool bench capacity``: the search (pure, with fake trials), bad input, a tiny run.

The tiny run checks the shape of what the bench writes and that it goes through the
server's own code; its numbers are not checked (a timing belongs in a benchmark).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asrpool.bench import capacity, intake


def _fake_trial(limit: int, oom_from: int | None = None) -> Any:
    def trial(batch: int) -> dict[str, Any]:
        oom = oom_from is not None and batch >= oom_from
        return {"batch_size": batch, "passed": batch <= limit and not oom, "oom": oom}
    return trial


def test_search_grows_geometrically_then_bisects_to_the_resolution() -> None:
    found = capacity.search(_fake_trial(100), start=1, max_batch=4096, max_trials=30,
                            resolution=0.0)
    tried = [r["batch_size"] for r in found.rows]
    assert tried[:8] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert found.capacity == 100 and found.bound == "latency"
    assert len(tried) == len(set(tried)) <= 15


def test_out_of_memory_is_the_bound_not_a_crash() -> None:
    found = capacity.search(_fake_trial(10_000, oom_from=300), 16, 4096, 30, 0.0)
    assert found.capacity == 299 and found.bound == "memory"


def test_the_search_is_bounded_by_trials_max_batch_and_time() -> None:
    assert capacity.search(_fake_trial(10_000), 1, 4096, 5, 0.0).bound == "trials"
    assert capacity.search(_fake_trial(10_000), 1, 4096, 5, 0.0).capacity == 16
    assert capacity.search(_fake_trial(10_000), 1, 48, 30, 0.0).capacity == 48
    assert capacity.search(_fake_trial(10_000), 1, 48, 30, 0.0).bound == "max_batch"
    assert capacity.search(_fake_trial(10_000), 1, 48, 30, 0.0, deadline=0.0).rows == []


def test_a_failing_start_bisects_down() -> None:
    found = capacity.search(_fake_trial(5), 64, 4096, 30, 0.0)
    assert found.capacity == 5 and [r["batch_size"] for r in found.rows][:3] == [64, 32, 16]


def test_next_batch_stops_within_the_resolution() -> None:
    assert capacity.next_batch(100, 104, 4096, 0.05) is None
    assert capacity.next_batch(100, 120, 4096, 0.05) == 110
    assert capacity.next_batch(0, 1, 4096, 0.05) is None


def test_cost_per_audio_hour() -> None:
    assert capacity.cents_per_audio_hour(2.0, 400) == 0.5
    assert capacity.cents_per_audio_hour(2.0, 0) is None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "asrpool.cli", "bench", "capacity", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("args", "says"), [
    (["--device", "cuda"], "no CUDA device"),
    (["--device", "tpu"], "device"),
    (["--model", "no-such-model"], "unknown model"),
    (["--model", "tiny", "--start", "100000000", "--max-batch", "100000000",
      "--max-trials", "3"], "does not fit in memory"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], says: str, tmp_path: Path) -> None:
    done = _cli(*args, "--out", str(tmp_path))
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert not list(tmp_path.iterdir())


def test_tiny_run_writes_json_and_png(tmp_path: Path) -> None:
    assert capacity.main(["--model", "tiny", "--max-batch", "4", "--steps", "3",
                          "--warmup", "1", "--max-p99-ms", "10000", "--torch-threads", "1",
                          "--price-per-gpu-hour", "2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "capacity-tiny-cpu.json").read_text())
    assert result["model"] == "tiny" and result["device"] == "cpu"
    assert result["streams_per_gpu"] == 4 and result["bound"] == "max_batch"
    assert [r["batch_size"] for r in result["batches"]] == [1, 2, 4]
    assert result["cents_per_audio_hour"] == 50.0
    assert result["cuda_graphs"]["applies"] is False
    row = result["batches"][-1]
    assert row["passed"] and row["steps"] == 3 and row["cuda_graphs"] is None
    assert row["step_p50_ms"] > 0 and row["state_bytes"] == 4 * row["state_bytes_per_slot"]
    assert 0 < row["intake_p50_ms"] < row["host_p50_ms"] + row["engine_p50_ms"]
    assert "gpu_peak_allocated_bytes" not in row
    assert result["memory"]["source"] == "engine.state_nbytes()"
    assert (tmp_path / "capacity-tiny-cpu.png").read_bytes()[:4] == b"\x89PNG"
    # The capacity batch's messages, and what the websocket layer adds for them.
    assert row["messages_in_per_stream_step"] == 1 and row["message_in_bytes"] > 7680
    assert row["messages_out_per_stream_step"] >= 1 and row["message_out_bytes"] > 0
    limits = result["ceilings"]
    assert limits["socket_us_per_stream"] > 0
    assert limits["host_with_sockets_us_per_stream"] == pytest.approx(
        limits["host_us_per_stream"] + limits["socket_us_per_stream"], abs=0.02)
    assert limits["host_with_sockets_streams"] < limits["host_streams"]
    measured = limits["sockets"]  # what it was computed from
    assert measured["message_bytes"] == row["message_in_bytes"]
    assert limits["socket_us_per_stream"] == pytest.approx(
        row["messages_in_per_stream_step"] * measured["receive_us"]
        + row["messages_out_per_stream_step"] * measured["send_us"], abs=0.02)


def test_a_trial_runs_the_servers_slots_and_sessions() -> None:
    """The pod step really goes through buffers, the engine and the sessions' outboxes."""
    from asrpool.server import models

    pod = capacity.PodStep(models.load_model("tiny"), 2)
    try:
        for _ in range(12):  # past the model's delay: words and Steps come out
            pod()
        assert all(stream.sent > 0 for stream in pod.streams)
        assert pod.engine.steps_run == 12 and pod.buffers.buffered_total() == 0
    finally:
        pod.close()


def test_a_noisy_trial_runs_again_and_a_slow_one_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    results = iter([{"passed": False, "oom": False, "step_p50_ms": 60, "step_p99_ms": 900},
                    {"passed": True, "oom": False, "step_p50_ms": 60, "step_p99_ms": 70},
                    {"passed": False, "oom": False, "step_p50_ms": 95, "step_p99_ms": 99}])
    monkeypatch.setattr(capacity, "trial", lambda *args: next(results))
    settings = capacity.TrialSettings(10, 1, 80.0, None)
    again = capacity.trial_again_if_noisy(None, 4, settings, None, retries=1)
    assert again["passed"] and again["runs"] == 2 and again["p99_ms_of_runs"] == [900, 70]
    slow = capacity.trial_again_if_noisy(None, 8, settings, None, retries=1)
    assert not slow["passed"] and slow["runs"] == 1


@pytest.mark.parametrize("kind", intake.KINDS)
def test_every_input_kind_keeps_every_stream_fed(kind: str) -> None:
    """Each kind goes through the server's intake and no stream runs dry: every step
    runs a frame of every stream, and every stream gets its results."""
    from asrpool.server import models

    pod = capacity.PodStep(models.load_model("tiny"), 3, kind, steps=30)
    try:
        frames = []
        for _ in range(30):
            pod()
            frames.append(pod.engine.steps_run)
        assert frames == list(range(1, 31))
        assert [stream.sent >= 30 for stream in pod.streams] == [True] * 3  # a Step each
    finally:
        pod.close()


def test_ceilings_say_which_part_binds() -> None:
    row = {"batch_size": 100, "host_cpu_p50_ms": 20.0, "engine_p50_ms": 40.0,
           "host_us_per_stream": 200.0}
    assert capacity.ceilings(row) == {"at_batch": 100, "host_us_per_stream": 200.0,
                                      "host_streams": 400, "engine_streams": 200,
                                      "binds": "engine"}
    assert capacity.ceilings(row | {"host_cpu_p50_ms": 50.0})["binds"] == "host"
    assert capacity.ceilings(None) is None


def test_lanes_children_are_a_third_ceiling() -> None:
    """Two children at 100 us per stream each hold 80 ms / 100 us streams: 1,600."""
    row = {"batch_size": 100, "host_cpu_p50_ms": 2.0, "engine_p50_ms": 4.0,
           "host_us_per_stream": 20.0, "helpers_us_per_stream": 100.0, "helper_processes": 2}
    limits = capacity.ceilings(row)
    assert limits is not None
    assert (limits["host_streams"], limits["engine_streams"], limits["helpers_streams"],
            limits["binds"]) == (4000, 2000, 1600, "helpers")
    assert capacity.ceilings(row | {"helpers_us_per_stream": 20.0})["binds"] == "engine"


def test_the_websocket_layer_is_added_to_the_hosts_work() -> None:
    """One event loop does both: 20 us of host work and 20 us of sockets hold 2,000."""
    row = {"batch_size": 100, "host_cpu_p50_ms": 2.0, "engine_p50_ms": 1.0,
           "host_us_per_stream": 20.0, "socket_us_per_stream": 20.0}
    limits = capacity.ceilings(row)
    assert limits is not None
    assert (limits["host_streams"], limits["host_with_sockets_us_per_stream"],
            limits["host_with_sockets_streams"]) == (4000, 40.0, 2000)
