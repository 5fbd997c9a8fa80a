"""``asrpool bench soak`` runs end to end with tiny numbers: its attacks against a real
pod and router, no slot or session leaked (the figures are the bench's). The client
that never reads takes some 15 s on this machine to fill its buffers: it is left to
``tests/hostile/test_slow_readers.py``."""

from __future__ import annotations

import json
from pathlib import Path

from asrpool.bench import soak


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
