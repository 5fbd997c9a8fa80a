"""``asrpool bench soak`` runs end to end with tiny numbers: its attacks against a real
pod and router, no slot or session leaked (the figures are the bench's). The client
that never reads takes some 15 s on this machine to fill its buffers: it is left to
``tests/hostile/test_slow_readers.py``."""

from __future__ import annotations

import json
from pathlib import Path

from asrpool_harness.bench import soak


def test_bench_soak_writes_json_and_leaks_nothing(tmp_path: Path) -> None:
    assert soak.main([
        "--slots", "2", "--fuzz-frames", "200", "--fuzz-workers", "1", "--half-open", "5",
        "--header-floods", "2", "--head-mib", "1", "--query-floods", "1",
        "--attacks", "header_flood,query_flood,half_open,tiny_frames,markers,churn,fuzz",
        "--churn-seconds", "1", "--churn-workers", "2", "--settle-seconds", "5",
        "--flood-messages", "3000",
        "--baseline-seconds", "2", "--handshake-timeout-seconds", "1",
        "--send-timeout-seconds", "1",
        "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "soak.json").read_text())
    print(json.dumps({k: v for k, v in result.items() if k != "phases"}))
    assert result["slots_leaked"] == result["sessions_leaked"] == 0
    assert result["connections_held"] == 0
    phases = {p["attack"]: p for p in result["phases"]}
    assert set(phases) == {"baseline"} | {f"{a}@{t}" for t in ("pod", "router") for a in (
        "header_flood", "query_flood", "half_open", "tiny_frames", "markers", "churn", "fuzz")}
    assert phases["fuzz@pod"]["result"]["tried"] == 100
    assert phases["fuzz@router"]["result"]["unrefused"] == 0
    assert phases["markers@router"]["result"]["error_codes"] == ["too_many_markers"]
    assert phases["baseline"]["neighbour"]["n"] > 0
    churned = phases["churn@pod"]["result"]
    assert churned["tried"] == sum(churned["outcomes"].values()) > 0
    assert churned["outcomes"]["ready"] > 0
    assert result["neighbour_errors"] == []


def test_bench_soak_amplification_attacks_are_refused_and_hold_nothing(tmp_path: Path) -> None:
    """Opus declaring two hours (posted, two at once beside the neighbour: 413 before
    decoding; in one websocket message: decoded as the engine takes it), an upload left
    as soon as it has a slot, bodies that stall or trickle (408): against the pod and
    through the router."""
    assert soak.main([
        "--slots", "3", "--attacks", "upload_bomb,opus_bomb,abandoned_upload,slow_body",
        "--bomb-hours", "2", "--upload-bombs", "2", "--opus-bomb-seconds", "2",
        "--abandoned-uploads", "1", "--abandoned-seconds", "300", "--slow-bodies", "2",
        "--body-timeout-seconds", "1", "--settle-seconds", "5", "--baseline-seconds", "2",
        "--name", "amplification", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "amplification.json").read_text())
    assert result["slots_leaked"] == result["sessions_leaked"] == 0
    phases = {p["attack"]: p for p in result["phases"]}
    for target in ("pod", "router"):
        bombs = phases[f"upload_bomb@{target}"]["result"]
        assert bombs["declared_s"] == 7200 and bombs["statuses"] == {"413": 2}
        assert [a.endswith("over the limit of 3600 s (max_upload_seconds)")
                for a in bombs["answers"]] == [True]
        streamed = phases[f"opus_bomb@{target}"]
        assert streamed["result"]["declared_s"] == 7200 and streamed["result"]["steps"] > 0
        assert streamed["result"]["error_codes"] == []
        # Two hours decoded at once would be 660 MiB of float32 in the pod.
        assert streamed["memory_growth_mib"]["pod"] < 200
        abandoned = phases[f"abandoned_upload@{target}"]["result"]
        assert abandoned["slots_taken"] == 1 and abandoned["slots_held"] == 0
        slow = phases[f"slow_body@{target}"]["result"]
        assert slow["statuses"] == {"408": 2} and slow["connections_held"] == 0
    assert result["neighbour_errors"] == []


def test_bench_soak_opus_bomb_through_opus_lanes_holds_nothing(tmp_path: Path) -> None:
    """The websocket Opus bomb against a pod whose Opus lanes decode it: the child
    decodes no faster than the slot takes it, and nothing is left held."""
    assert soak.main([
        "--slots", "3", "--attacks", "opus_bomb", "--opus-workers", "2", "--bomb-hours", "2",
        "--opus-bomb-seconds", "2", "--settle-seconds", "5", "--baseline-seconds", "2",
        "--name", "lanes", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "lanes.json").read_text())
    assert result["slots_leaked"] == result["sessions_leaked"] == 0
    for target in ("pod", "router"):
        streamed = next(p for p in result["phases"] if p["attack"] == f"opus_bomb@{target}")
        assert streamed["result"]["declared_s"] == 7200 and streamed["result"]["steps"] > 0
        assert streamed["result"]["error_codes"] == []
        assert streamed["memory_growth_mib"]["pod"] < 200
    assert result["neighbour_errors"] == []
