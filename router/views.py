"""A read-only JSON view of pools and pods, as admission counts them.

Reads are not atomic (admission may move between them); the view is for people and
dashboards, never for decisions. It is public (the live page reads it), so it names
no pod address: those are for routers, from Redis.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import redis.asyncio as aioredis

from asrpool.common import protocol, registry
from asrpool.router import keys, policies


@dataclasses.dataclass(frozen=True)
class PodView:
    beat: registry.PodHeartbeat
    router_sessions: int

    @property
    def load(self) -> policies.PodLoad:
        used = policies.effective_used(self.beat.used_slots, self.router_sessions)
        return policies.PodLoad(
            self.beat.pod_id, self.beat.address, self.beat.total_slots, used,
            self.beat.draining or self.beat.overloaded,  # neither takes a new stream
        )

    def to_json(self) -> dict[str, Any]:
        load = self.load
        return {
            "pod_id": self.beat.pod_id,
            "model": self.beat.model,
            "draining": self.beat.draining,
            "overloaded": self.beat.overloaded,
            "total_slots": self.beat.total_slots,
            "reported_free_slots": self.beat.free_slots,
            "router_sessions": self.router_sessions,
            "free_slots": 0 if load.draining else load.free,
            "updated_ms": self.beat.updated_ms,
        }


async def read_pod(redis: aioredis.Redis, beat: registry.PodHeartbeat, now_ms: int) -> PodView:
    live = await redis.zcount(keys.pod_sessions(beat.pool, beat.pod_id), f"({now_ms}", "+inf")
    return PodView(beat, live)


async def read_pool(redis: aioredis.Redis, pool: str,
                    malformed: list[str] | None = None) -> list[PodView]:
    beats = await registry.read_pool(redis, pool, malformed)
    now = await registry.redis_now_ms(redis)  # the clock the sessions' scores are set by
    return [await read_pod(redis, beat, now) for beat in beats]


@dataclasses.dataclass(frozen=True)
class Pricing:
    gpu_hour_price: float | None  # dollars; None: cost not configured
    gpus_per_pod: float = 1.0


def cost(pricing: Pricing, pods: int, streams: int) -> dict[str, float | None]:
    """What a pool costs now, and per audio-hour at its current load: each open stream
    is taken to send audio in real time (one audio-hour per hour)."""
    gpus = pods * pricing.gpus_per_pod
    if pricing.gpu_hour_price is None:
        return {"gpus": gpus, "cents_per_hour": None, "cents_per_audio_hour": None}
    per_hour = 100 * pricing.gpu_hour_price * gpus
    per_audio_hour = per_hour / streams if streams else None
    return {"gpus": gpus, "cents_per_hour": round(per_hour, 4),
            "cents_per_audio_hour": None if per_audio_hour is None else round(per_audio_hour, 4)}


async def pools_json(redis: aioredis.Redis, pricing: Pricing | None = None) -> dict[str, Any]:
    pricing = pricing or Pricing(None)
    out = {}
    for pool in await registry.read_pools(redis):
        malformed: list[str] = []
        pods = await read_pool(redis, pool, malformed)
        loads = [p.load for p in pods]
        streams = sum(p.beat.used_slots for p in pods)
        out[pool] = {
            "total_slots": sum(p.total for p in loads),
            "free_slots": policies.free_slots(loads),
            "streams": streams,
            "waiting": await redis.zcard(keys.pool_queue(pool)),
            "cost": cost(pricing, len(pods), streams),
            "pods": [p.to_json() for p in pods],
            # Records that are no heartbeat (pod id and why): no pod to any router.
            "malformed_heartbeats": malformed,
            # Lease entries past the most a router reads (registry.MAX_PODS_READ): a
            # pool's lease set filled by whoever writes it.
            "unread_pods": await registry.unread_pods(redis, pool),
        }
    return {"pools": out}


def modules_info(pools: dict[str, Any], default_pool: str) -> list[dict[str, str]]:
    """moshi-server's ``/api/modules_info`` (a list of string maps), one module per pool."""
    out = []
    for name, pool in pools["pools"].items():
        prefix = "" if name == default_pool else f"/pools/{name}"
        total = pool["total_slots"]
        out.append(
            {
                "type": "batched_asr",
                "path": prefix + protocol.STREAMING_PATH,
                "used_slots": str(total - pool["free_slots"]),
                "total_slots": str(total),
                "pool": name,
            }
        )
    return out
