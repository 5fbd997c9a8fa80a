"""``asrpool bench server`` and ``bench gil`` run end to end (smoke runs; the numbers are not
checked)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from asrpool.bench import server as bench_server


def test_bench_server_writes_json(tmp_path: Path) -> None:
    assert bench_server.main(["--model", "tiny", "--batch-size", "1", "--clients", "1,2",
                              "--seconds", "1", "--torch-threads", "1",
                              "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "server-tiny-cpu-b1.json").read_text())
    assert result["gil_switch_ms"] == 0.2  # the pod's own default, recorded
    first, second = result["rounds"]
    assert first["frames"] == 12 and first["refused"] == 0
    assert second["refused"] == 1  # two clients, one slot
    assert first["p50_latency_s"] > 0 and result["rss_mib_over_time"]
    assert result["wake_us"] > 0  # the machine's cost of a wake-up, beside the loop's
    # The model runs in the pod's engine thread: no child process has CPU to show.
    cores = first["pod_cpu_cores"]
    assert cores["event_loop"] > 0 and cores["other_threads"] > 0
    assert cores["child_processes"] == 0
    assert first["loop_us_per_frame"] > 0


def test_bench_server_runs_both_protocols_side_by_side(tmp_path: Path) -> None:
    assert bench_server.main(["--model", "tiny", "--batch-size", "2", "--clients", "2",
                              "--seconds", "1", "--torch-threads", "1",
                              "--protocols", "kyutai,realtime", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "server-tiny-cpu-b2-kyutai-realtime.json").read_text())
    kyutai, realtime = result["rounds"]
    assert (kyutai["protocol"], realtime["protocol"]) == ("kyutai", "realtime")
    assert kyutai["frames"] == realtime["frames"] == 24 and realtime["refused"] == 0
    assert realtime["loop_us_per_frame"] > 0
    assert 0 < realtime["created_p50_s"] <= realtime["created_max_s"]
    assert 0 < realtime["completed_p50_s"] <= realtime["completed_max_s"]


def test_bench_server_refuses_realtime_with_raw_clients(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="realtime with the websockets clients"):
        bench_server.main(["--protocols", "realtime", "--raw-clients", "--out", str(tmp_path)])


def test_bench_server_runs_an_earlier_commits_pod_beside_this_ones(tmp_path: Path) -> None:
    assert bench_server.main(["--model", "tiny", "--batch-size", "1", "--clients", "1",
                              "--seconds", "1", "--torch-threads", "1", "--before", "HEAD",
                              "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "server-tiny-cpu-b1-vs-HEAD.json").read_text())
    (after,), (before,) = result["rounds"], result["rounds_before"]
    assert after["frames"] == before["frames"] == 12
    assert result["before"] == "HEAD" and len(result["p99_after_over_before"]) == 1
    assert (tmp_path / "server-tiny-cpu-b1-vs-HEAD-before.log").exists()  # its own log


def test_bench_server_spreads_clients_over_processes_and_sets_the_pods_gil_switch(
        tmp_path: Path) -> None:
    assert bench_server.main(["--model", "tiny", "--batch-size", "2", "--clients", "2",
                              "--seconds", "1", "--torch-threads", "1",
                              "--client-processes", "2", "--dtype", "float32",
                              "--gil-switch-ms", "5", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "server-tiny-cpu-b2-gil5ms.json").read_text())
    (only,) = result["rounds"]
    assert only["frames"] == 24 and only["refused"] == 0
    assert result["client_processes"] == 2 and result["dtype"] == "float32"
    assert result["gil_switch_ms"] == 5.0
    assert only["mean_handover_s"] is None  # no engine process, no hand-over


def test_bench_server_sends_each_frame_in_pieces_as_browsers_do(tmp_path: Path) -> None:
    assert bench_server.main(["--model", "tiny", "--batch-size", "2", "--clients", "2",
                              "--seconds", "1", "--torch-threads", "1", "--message-ms", "20",
                              "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "server-tiny-cpu-b2-msg20ms.json").read_text())
    (only,) = result["rounds"]
    # Every frame, sent as four 20 ms messages, is answered once: the pod joins them.
    assert only["frames"] == 24 and only["refused"] == 0 and only["messages_per_frame"] == 4
    assert result["message_ms"] == 20 and only["loop_us_per_frame"] > 0


def test_bench_server_admits_more_clients_at_once_than_the_pods_new_streams_burst(
        tmp_path: Path) -> None:
    # 120 clients connect together, past a pod's default burst of 100 new streams; the
    # bench measures streams at capacity, so its pod takes any number a second.
    assert bench_server.main(["--model", "tiny", "--batch-size", "120", "--clients", "120",
                              "--seconds", "0.5", "--torch-threads", "1",
                              "--out", str(tmp_path)]) == 0
    (only,) = json.loads((tmp_path / "server-tiny-cpu-b120.json").read_text())["rounds"]
    assert only["refused"] == 0 and only["frames"] == 120 * 6


def test_bench_server_runs_a_pod_with_its_engine_in_a_child_process(tmp_path: Path) -> None:
    assert bench_server.main(["--model", "tiny", "--batch-size", "2", "--clients", "2",
                              "--seconds", "1", "--torch-threads", "1", "--engine-process",
                              "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "server-tiny-cpu-b2-process.json").read_text())
    (only,) = result["rounds"]
    assert only["frames"] == 24 and only["refused"] == 0 and result["engine_process"] is True
    assert only["mean_handover_s"] > 0  # the rest of its steps, beside the child's
    assert only["pod_cpu_cores"]["child_processes"] > 0  # the model's work is the child's
    # The pod's memory counts its engine process's: torch and the model live there.
    assert min(mib for _, mib in result["rss_mib_over_time"]) > 300


def test_bench_gil_times_the_engine_both_ways_under_a_busy_loop(tmp_path: Path) -> None:
    from asrpool_harness.bench import gil

    default = sys.getswitchinterval()
    assert gil.main(["--model", "tiny", "--batch", "2", "--steps", "2", "--rounds", "1",
                     "--busy", "0,0.5", "--switch-ms", "5,0.2", "--out", str(tmp_path)]) == 0
    assert sys.getswitchinterval() == default  # each round puts it back
    result = json.loads((tmp_path / "gil-tiny-b2.json").read_text())
    assert [(row["switch_ms"], row["loop_busy"]) for row in result["loads"]] == [
        (5.0, 0.0), (5.0, 0.5), (0.2, 0.0), (0.2, 0.5)]
    for row in result["loads"]:
        assert row["thread_step_ms"] > 0 and row["process_step_ms"] > 0
        assert 0 < row["process_handover_ms"] < row["process_step_ms"]
        assert len(row["rounds_ms"]["thread"]) == len(row["rounds_ms"]["process"]) == 1
        rates = row["loop_decodes_per_busy_s"]
        assert (rates["thread"] > 0) == (rates["process"] > 0) == (row["loop_busy"] > 0)


def test_bench_gil_refuses_a_loop_busy_all_the_time_and_no_switch_interval(
        capsys: pytest.CaptureFixture[str]) -> None:
    from asrpool_harness.bench import gil

    with pytest.raises(SystemExit) as exit_info:
        gil.main(["--busy", "0,1"])
    assert exit_info.value.code == 2
    assert "--busy: each share must be in [0, 1), got 0,1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        gil.main(["--switch-ms", "5,0"])
    assert exit_info.value.code == 2
    assert "--switch-ms: each interval must be in (0, 1000] ms, got 5,0" in capsys.readouterr().err


H200 = Path(__file__).resolve().parents[2] / "bench/results/capacity-stt-1b-en_fr-cuda.json"


def test_bench_server_drives_a_paced_pod_with_raw_clients(tmp_path: Path) -> None:
    """A paced stand-in of the H200's stt-1b-en_fr, in an engine process, driven by the
    raw clients: every frame of every admitted stream is timed to its Step, and the
    stream the pod has no slot for is counted as refused."""
    assert bench_server.main(["--paced-engine", str(H200), "--batch-size", "4",
                              "--clients", "5", "--seconds", "1", "--client-processes", "2",
                              "--engine-process", "--out", str(tmp_path)]) == 0
    result = json.loads(
        (tmp_path / "server-stt-1b-en_fr-cpu-b4-paced-process.json").read_text())
    assert result["paced_engine"] == str(H200) and result["raw_clients"]
    assert result["model"] == "stt-1b-en_fr"
    (only,) = result["rounds"]
    assert only["refused"] == 1 and only["frames"] == 4 * 12
    assert only["p50_latency_s"] > 0 and only["pod_cpu_cores"]["child_processes"] > 0


def test_bench_server_refuses_a_bad_paced_engine_file_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "capacity.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit) as exited:
        bench_server.main(["--paced-engine", str(bad), "--out", str(tmp_path)])
    assert str(exited.value) == f"asrpool bench server: paced engine file {bad}: names no model"
