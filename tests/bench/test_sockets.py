"""``bench/sockets.py``: a real uvicorn with the pod's websocket protocol, real paced clients;
the server's CPU per message each way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asrpool.bench import sockets


def test_socket_costs_are_measured_both_ways_and_grow_with_the_message() -> None:
    small = sockets.socket_costs(100, 80, count=2000, connections=8)
    assert small["messages"] == 2000 and small["message_bytes"] == 100
    assert small["connections"] == 8
    assert small["receive_us"] > 0 and small["send_us"] > 0
    large = sockets.socket_costs(1 << 20, 80, count=200, connections=8)  # copied, unmasked
    assert large["receive_us"] > small["receive_us"]


def test_the_bench_measures_every_reader_side_by_side(tmp_path: Path) -> None:
    assert sockets.main(["--kinds", "opus-20ms", "--count", "300", "--rounds", "1",
                         "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "sockets.json").read_text())
    (row,) = result["rows"]
    assert row["input"] == "opus-20ms" and row["messages_per_step"] == 4
    assert all(row["receive_us"][reader] > 0 for reader in sockets.READERS)
    assert row["idle_watch_over_deadline"] > 0
    assert row["handed_over_over_idle_watch"]["receive_us"] > 0


def test_the_handed_over_reader_parses_every_frame_length() -> None:
    """Its own parser: 7-bit, 16-bit and 64-bit payload lengths, reads split anywhere."""
    for size in (100, 7700, 1 << 20):
        costs = sockets.socket_costs(size, 80, count=64, reader="handed-over", connections=4)
        assert costs["messages"] == 64 and costs["receive_us"] > 0 and costs["send_us"] > 0


def test_bad_options_are_refused_naming_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert sockets.main(["--kinds", "opus,flac"]) == 2
    assert "flac" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown reader"):
        sockets.socket_costs(10, 10, reader="select")
