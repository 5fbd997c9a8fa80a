"""Helpers of the operator tests: pool manifests, reads of the emulated cluster, and
small assertions that return their value (for :func:`polling.eventually`)."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from asrpool.common import registry
from asrpool.operator import naming
from tests.operator import emulator
from tests.support.polling import eventually

NAMESPACE = emulator.NAMESPACE
KINDS = {emulator.CONFIG_MAPS: "stt-config", emulator.DEPLOYMENTS: "stt",
         emulator.SERVICES: "stt", emulator.DISRUPTION_BUDGETS: "stt",
         emulator.NETWORK_POLICIES: "stt"}


def manifest(name: str = "stt", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "asrpool.io/v1alpha1", "kind": "StreamingASRPool",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"model": {"name": "kyutai/stt-1b-en_fr"}, "slots": 16, "slotsPerPod": 8,
                     **spec}}


def condition(cluster: emulator.Cluster, kind: str, name: str = "stt") -> dict[str, Any]:
    pool = cluster.get(emulator.POOLS, NAMESPACE, name)
    assert pool is not None
    found = [c for c in pool.get("status", {}).get("conditions", []) if c["type"] == kind]
    assert found, f"no {kind} condition yet: {pool.get('status')}"
    return found[0]


def pool_status(cluster: emulator.Cluster, name: str = "stt") -> dict[str, Any]:
    pool = cluster.get(emulator.POOLS, NAMESPACE, name)
    assert pool is not None and "status" in pool, f"no status on {name} yet"
    return pool["status"]


def replicas(cluster: emulator.Cluster, name: str = "stt") -> int:
    deployment = cluster.get(emulator.DEPLOYMENTS, NAMESPACE, name)
    assert deployment is not None, "no Deployment yet"
    return int(deployment["spec"]["replicas"])


def children_of(cluster: emulator.Cluster, name: str = "stt") -> dict[str, dict[str, Any]]:
    found = {}
    for resource, child in KINDS.items():
        obj = cluster.get(resource, NAMESPACE, child.replace("stt", name))
        assert obj is not None, f"no {resource.plural} {child} yet"
        found[resource.plural or ""] = obj
    return found


async def created(cluster: emulator.Cluster, **spec: Any) -> dict[str, dict[str, Any]]:
    await cluster.create(manifest(**spec))
    return await eventually(lambda: children_of(cluster))


async def beat(url: str, pod: str, total: int, free: int,
               pool: str = f"{NAMESPACE}/stt") -> None:
    """A heartbeat of the pool's pod named ``pod``, under its id (naming.pod_id)."""
    client = aioredis.Redis.from_url(url)
    pod_id = naming.pod_id(pool.partition("/")[0], pod)
    try:
        await registry.write_heartbeat(client, registry.PodHeartbeat(
            pod_id, pool, f"{pod}:8080", total, free, False, "m"), lease_ms=120_000)
    finally:
        await client.aclose()


def passes(cluster: emulator.Cluster, mark: int, name: str = "stt") -> int:
    """Reads of the pool's Deployment since ``mark``: one or two per reconcile pass."""
    return sum(1 for r in cluster.requests_since(mark) if r.method == "GET"
               and r.resource == emulator.DEPLOYMENTS and r.name == name)


def assert_at_least(value: int, floor: int) -> int:
    assert value >= floor, f"{value} < {floor}"
    return value


def assert_at_most(value: int, ceiling: int) -> int:
    assert value <= ceiling, f"{value} > {ceiling}"
    return value


def assert_equal(value: Any, wanted: Any) -> Any:
    assert value == wanted, f"{value!r} != {wanted!r}"
    return value


def assert_degraded(cluster: emulator.Cluster, name: str = "stt") -> dict[str, Any]:
    found = condition(cluster, "Degraded", name)
    assert found["status"] == "True", found
    return found


def assert_gone(cluster: emulator.Cluster) -> None:
    assert cluster.get(emulator.POOLS, NAMESPACE, "stt") is None
