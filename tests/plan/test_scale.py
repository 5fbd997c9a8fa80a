"""A pool of 20,000 streams for two hours through the command, end to end: the numbers
add up, and the JSON and the PNG are written. (The wall time of the 100,000-stream day
is a benchmark, in bench/results/, not a condition here.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asrpool import cli


def test_twenty_thousand_streams_for_two_hours(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    code = cli.main([
        "plan", "--peak-streams", "20000", "--trough", "1", "--hours", "2",
        "--mean-duration", "600", "--slots-per-pod", "32", "--autoscale",
        "--queue-timeout-seconds", "5", "--gpu-hour-price", "3", "--json", str(out),
        "--png", str(png),
        "--compare", "--policy spread --target-free 0.1"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "cost per audio-hour" in printed
    pack, spread = json.loads(out.read_text())["runs"]
    assert pack["arrivals"] == spread["arrivals"]  # the same seed: the same sessions
    assert 19_000 < pack["peak_streams"] < 21_500
    assert pack["refused"] == 0 and pack["streams_cut"] == 0
    assert 0.6 < pack["slot_occupancy"] < 0.75 < spread["slot_occupancy"]
    assert spread["mean_gpus"] < pack["mean_gpus"]  # less headroom, fewer GPUs
    assert pack["cost_per_audio_hour"] == pytest.approx(
        pack["gpu_hours"] * 3 / pack["audio_hours"], rel=1e-3)
    assert len(pack["timeline"]["at_seconds"]) == 120
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
