"""Live slot use of a pool, from the heartbeats its server pods write to Redis."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import redis.asyncio as aioredis

from asrpool.common import registry
from asrpool.operator import naming


@dataclasses.dataclass(frozen=True)
class Usage:
    """Slots of the pool's live pods; draining pods offer none but may still stream, and
    overloaded ones (behind real time) offer no free slot."""

    slots: int = 0
    free_slots: int = 0
    active_streams: int = 0
    live_pods: int = 0
    draining_pods: int = 0
    overloaded_pods: tuple[str, ...] = ()  # their pod ids


def measured_slots(beats: Iterable[registry.PodHeartbeat]) -> int | None:
    """What the pool's serving pods measured for themselves (``slotsPerPod: auto``): the
    most. Other work on a pod's machine only ever slows its measurement (a pod that
    measured while another did finds fewer), and each pod serves what it measured
    itself, so no pod is given more than it holds; ``status.slots`` shows the sum."""
    serving = [beat.total_slots for beat in beats if not beat.draining and beat.total_slots]
    return max(serving) if serving else None


def summarise(beats: Iterable[registry.PodHeartbeat]) -> Usage:
    beats = list(beats)
    serving = [beat for beat in beats if not beat.draining]
    return Usage(
        slots=sum(beat.total_slots for beat in serving),
        free_slots=sum(beat.free_slots for beat in serving if not beat.overloaded),
        active_streams=sum(beat.used_slots for beat in beats),
        live_pods=len(beats),
        draining_pods=len(beats) - len(serving),
        overloaded_pods=tuple(sorted(beat.pod_id for beat in serving if beat.overloaded)),
    )


async def read_beats(redis: aioredis.Redis, pool_name: str) -> list[registry.PodHeartbeat]:
    return await registry.read_pool(redis, pool_name)


def deletion_costs(
    pods: Iterable[Mapping[str, Any]], beats: Iterable[registry.PodHeartbeat]
) -> dict[str, int]:
    """Each pod's ``pod-deletion-cost``: its streams now, so idle pods are removed first.

    A pod without a heartbeat (starting, or dead) costs 0 like an idle one; a draining pod
    keeps its cost, so it is not preferred over an idle pod that has no streams at all.
    """
    used = {beat.pod_id: beat.used_slots for beat in beats}
    return {_name(pod): used.get(_pod_id(pod), 0) for pod in pods}


def members(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The pool's real pods for the routers' admission: pod id (naming.pod_id) to pod IP,
    for every pod that has an IP (a draining one too: admission skips it by its heartbeat)."""
    found = {}
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if ip:
            found[_pod_id(pod)] = str(ip)
    return found


def cost_changes(pods: Iterable[Mapping[str, Any]], costs: Mapping[str, int]) -> dict[str, int]:
    """The costs that differ from what each pod carries already (patch only those)."""
    return {
        _name(pod): costs[_name(pod)]
        for pod in pods
        if _annotation(pod, naming.DELETION_COST_ANNOTATION) != str(costs[_name(pod)])
    }


def _name(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def _pod_id(pod: Mapping[str, Any]) -> str:
    return naming.pod_id(str(pod["metadata"]["namespace"]), _name(pod))


def _annotation(obj: Mapping[str, Any], key: str) -> str | None:
    return (obj.get("metadata", {}).get("annotations") or {}).get(key)
