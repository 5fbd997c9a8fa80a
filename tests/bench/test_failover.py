"""``asrpool bench failover`` end to end at a tiny scale: Redis run by Sentinel, two tiny
pods and a router; the primary SIGKILLed under 4 real-time streams and a stream opened
and closed every 0.2 s. Its JSON has every figure, and the issue's invariants hold: no
stream cut, no pod ever over its slots (three slots each, ``pack`` fills pod-0), no pod
answering ``busy``, new streams admitted again within 10 s of the kill."""

from __future__ import annotations

import json
from pathlib import Path

from asrpool_harness.bench import failover

SLOTS = 3


def test_bench_failover_cuts_nothing_over_admits_nothing_and_admits_again(
        tmp_path: Path) -> None:
    code = failover.main(["--streams", "4", "--seconds", "5", "--kill-at", "2",
                          "--slots", str(SLOTS), "--out", str(tmp_path)])
    result = json.loads((tmp_path / "failover-4.json").read_text())
    print(json.dumps({k: result[k] for k in ("long_streams", "slots", "churn")}))
    assert result["parameters"] | {"redis": ""} == {
        "streams": 4, "audio_seconds": 5.0, "pods": 2, "slots_per_pod": SLOTS,
        "model": "tiny", "policy": "pack", "pods_refuse_when_behind_real_time": False,
        "kill_at_s": 2.0, "churn_interval_s": 0.2,
        "sample_interval_s": 0.1, "redis": ""}
    assert result["machine"]["cpus"] >= 1 and result["date"]

    streams = result["long_streams"]
    assert (streams["streams"], streams["kept"], streams["cut"]) == (4, 4, [])
    assert streams["streaming_at_kill"] == 4  # the kill fell in the middle of them
    assert streams["longest_gap_ms"] > 0

    slots = result["slots"]
    assert set(slots["pods"]) == {"pod-0", "pod-1"}
    for pod in slots["pods"].values():
        assert pod["slots"] == SLOTS
        assert pod["max_slots_held"] == max(pod["max_used_by_heartbeat"],
                                            pod["max_sessions_counted"])
        assert pod["max_slots_held"] <= SLOTS and not pod["over_slots"]
        assert pod["busy_answers"] == 0
        assert set(pod["not_admitting"]) <= {"lapsed", "draining", "overloaded", "full"}
        for closed in pod["not_admitting"].values():
            assert closed["samples"] >= 1 and closed["first_s"] <= closed["last_s"]
    # the samples saw every long stream held (pack fills pod-0 first, unless a short
    # stream takes one of its slots for a moment)
    assert sum(pod["max_slots_held"] for pod in slots["pods"].values()) >= 4
    assert slots["pods_over_slots"] == [] and slots["pod_busy_answers"] == 0
    assert slots["samples"] > 0 and slots["registry_read_again_after_s"] is not None

    churn = result["churn"]
    assert churn["attempts"] == churn["admitted"] + sum(churn["refused"].values())
    after = churn["after_kill"]
    assert after["attempts"] == after["admitted"] + sum(after["refused"].values())
    assert after["admitted"] >= 1
    assert 0 < after["admitted_again_after_s"] <= 10.0
    if after["refused"]:  # refused while no primary answered: a window that closed
        window = after["refusal_window"]
        assert 0 <= window["first_s"] <= window["last_s"]
        assert abs(window["lasted_s"] - (window["last_s"] - window["first_s"])) <= 0.011
        assert set(after["refusal_window_by_code"]) == set(after["refused"])

    assert result["invariants"] == {"no_stream_cut": True, "no_pod_over_slots": True,
                                    "no_pod_answered_busy": True,
                                    "admitted_again_within_10_s": True}
    assert code == 0
