"""Slot use from heartbeats, and the deletion costs made of it."""

from __future__ import annotations

from typing import Any

from asrpool.common import registry
from asrpool.operator import naming, usage


def beat(pod: str, total: int, free: int, draining: bool = False) -> registry.PodHeartbeat:
    return registry.PodHeartbeat(pod, "stt", f"{pod}:8080", total, free, draining, "m")


def pod(name: str, cost: str | None = None) -> dict[str, Any]:
    annotations = {} if cost is None else {naming.DELETION_COST_ANNOTATION: cost}
    return {"metadata": {"name": name, "namespace": "ns", "annotations": annotations}}


def test_draining_pods_offer_no_slots_but_their_streams_count() -> None:
    summary = usage.summarise([beat("a", 8, 3), beat("b", 8, 8), beat("c", 8, 6, draining=True)])
    assert summary == usage.Usage(slots=16, free_slots=11, active_streams=7, live_pods=3,
                                  draining_pods=1)


def test_costs_are_live_streams_and_unknown_pods_cost_nothing() -> None:
    """Pods are named in the API, their beats by pod id (NAMESPACE/NAME)."""
    costs = usage.deletion_costs([pod("a"), pod("b"), pod("new")],
                                 [beat("ns/a", 8, 3), beat("ns/b", 8, 8), beat("ns/gone", 8, 0),
                                  beat("other/b", 8, 0)])
    assert costs == {"a": 5, "b": 0, "new": 0}


def test_only_changed_costs_are_written() -> None:
    pods = [pod("a", "5"), pod("b", "2"), pod("c")]
    assert usage.cost_changes(pods, {"a": 5, "b": 0, "c": 0}) == {"b": 0, "c": 0}


async def test_beats_are_read_from_a_real_redis(redis_server: Any) -> None:
    client = registry.aioredis.Redis.from_url(redis_server.url)
    try:
        await registry.write_heartbeat(client, beat("a", 8, 2))
        await registry.write_heartbeat(client, registry.PodHeartbeat(
            "x", "other", "x:8080", 8, 8, False, "m"))
        beats = await usage.read_beats(client, "stt")
    finally:
        await client.aclose()
    assert [(b.pod_id, b.used_slots) for b in beats] == [("a", 6)]


def test_members_are_the_pods_with_an_ip() -> None:
    pods = [{"metadata": {"name": "a", "namespace": "ns"}, "status": {"podIP": "10.0.0.1"}},
            {"metadata": {"name": "b", "namespace": "ns"}, "status": {}},  # not yet scheduled
            {"metadata": {"name": "c", "namespace": "ns", "deletionTimestamp": "t"},
             "status": {"podIP": "10.0.0.3"}}]
    assert usage.members(pods) == {"ns/a": "10.0.0.1", "ns/c": "10.0.0.3"}


def test_the_slots_pods_measured_are_the_most_a_serving_pod_reports() -> None:
    beats = [registry.PodHeartbeat("a", "p", "10.0.0.1:1", 256, 256, False, "m"),
             registry.PodHeartbeat("b", "p", "10.0.0.2:1", 192, 100, False, "m"),
             registry.PodHeartbeat("c", "p", "10.0.0.3:1", 64, 64, True, "m")]  # draining
    assert usage.measured_slots(beats) == 256
    assert usage.measured_slots(beats[2:]) is None
