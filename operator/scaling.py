"""The built-in autoscaler's pass over one pool: read its demand, step, report.

The pure policy is :mod:`asrpool.operator.autoscaling`; this module reads what the
routers leave in Redis (clients waiting, clients refused) and writes
``status.autoscaling``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio as aioredis

from asrpool.common import registry, waiting
from asrpool.operator import autoscaling, pools, usage


async def read_demand(client: aioredis.Redis, pool: pools.Pool, slot_use: usage.Usage,
                      window_seconds: float) -> autoscaling.Demand | None:
    """Active streams, clients waiting now, requests refused in the window; None when
    Redis cannot be read (then nothing is scaled)."""
    try:
        await registry.announce(client, pool.registry_name)
        unmet = await waiting.read(client, pool.registry_name, window_seconds)
    except (redis.RedisError, OSError):
        return None
    return autoscaling.Demand(slot_use.active_streams, unmet.waiting, unmet.refused)


def status(decision: autoscaling.Decision, demand: autoscaling.Demand, scaled_at: str | None,
           previous: Mapping[str, Any]) -> dict[str, Any]:
    """``status.autoscaling``; ``scaled_at`` when this pass changed spec.slots."""
    report: dict[str, Any] = {
        "recommendedSlots": decision.recommended,
        "desiredSlots": decision.slots,
        "limitedBy": decision.limited_by,
        "activeStreams": demand.active,
        "waitingClients": demand.waiting,
        "refusedClients": demand.refused,
    }
    last = scaled_at or previous.get("lastScaleTime")
    if last:
        report["lastScaleTime"] = last
    return report


def message(before: int, decision: autoscaling.Decision, demand: autoscaling.Demand,
            pool: pools.Pool) -> str:
    """The ``Autoscaled`` event's text."""
    text = (f"spec.slots {before} -> {decision.slots}: {demand.active} active streams,"
            f" {demand.waiting} waiting, {demand.refused} refused;"
            f" {pool.autoscaling.target_free_fraction:.0%} kept free")
    if decision.limited_by != autoscaling.AS_RECOMMENDED:
        text += f" (limited by {decision.limited_by})"
    return text
