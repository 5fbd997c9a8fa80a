"""The Redis slot registry: the key schema that server pods write and routers read.

Every server pod heartbeats (at least once a second) into:

- ``asrpool:pod:{pod_id}``: a hash with the fields of :class:`PodHeartbeat`, on a
  lease (``PEXPIRE``) so that a dead pod's hash vanishes within a few seconds;
- ``asrpool:pool:{pool}:pods``: a sorted set of the pool's pod ids scored by the
  lease deadline in Unix milliseconds, so readers can drop dead pods without ``SCAN``;
- ``asrpool:pools``: the set of pool names seen.

Readers must treat a pod as alive only while its hash exists and its score in the
pool set is in the future.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import redis.asyncio as aioredis

KEY_PREFIX = "asrpool"
POOLS_KEY = f"{KEY_PREFIX}:pools"
DEFAULT_POOL = "default"
DEFAULT_LEASE_MS = 3000


def pod_key(pod_id: str) -> str:
    return f"{KEY_PREFIX}:pod:{pod_id}"


def pool_pods_key(pool: str) -> str:
    return f"{KEY_PREFIX}:pool:{pool}:pods"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclasses.dataclass(frozen=True)
class PodHeartbeat:
    """What a server pod tells the platform about itself."""

    pod_id: str
    pool: str
    address: str  # host:port that routers connect to
    total_slots: int
    free_slots: int
    draining: bool
    model: str
    updated_ms: int = 0

    @property
    def used_slots(self) -> int:
        return self.total_slots - self.free_slots

    def to_hash(self) -> dict[str, str]:
        fields = dataclasses.asdict(self)
        fields["draining"] = "1" if self.draining else "0"
        return {name: str(value) for name, value in fields.items()}

    @classmethod
    def from_hash(cls, raw: dict[Any, Any]) -> PodHeartbeat:
        fields = {_text(k): _text(v) for k, v in raw.items()}
        return cls(
            pod_id=fields["pod_id"],
            pool=fields["pool"],
            address=fields["address"],
            total_slots=int(fields["total_slots"]),
            free_slots=int(fields["free_slots"]),
            draining=fields["draining"] == "1",
            model=fields.get("model", ""),
            updated_ms=int(fields.get("updated_ms", "0")),
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def write_heartbeat(
    redis: aioredis.Redis, beat: PodHeartbeat, lease_ms: int = DEFAULT_LEASE_MS
) -> None:
    """Publish one heartbeat atomically (hash, lease, pool membership)."""
    beat = dataclasses.replace(beat, updated_ms=now_ms())
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(pod_key(beat.pod_id), mapping=beat.to_hash())  # type: ignore[arg-type]
        pipe.pexpire(pod_key(beat.pod_id), lease_ms)
        pipe.zadd(pool_pods_key(beat.pool), {beat.pod_id: beat.updated_ms + lease_ms})
        pipe.sadd(POOLS_KEY, beat.pool)
        await pipe.execute()


async def remove_pod(redis: aioredis.Redis, pod_id: str, pool: str) -> None:
    """Withdraw a pod at a clean exit, without waiting for its lease."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(pod_key(pod_id))
        pipe.zrem(pool_pods_key(pool), pod_id)
        await pipe.execute()


async def read_pool(redis: aioredis.Redis, pool: str) -> list[PodHeartbeat]:
    """The live pods of a pool (lease not expired), dropping dead members on the way."""
    key = pool_pods_key(pool)
    await redis.zremrangebyscore(key, "-inf", now_ms())
    pod_ids = [_text(p) for p in await redis.zrange(key, 0, -1)]
    beats = []
    for pod_id in pod_ids:
        raw = await redis.hgetall(pod_key(pod_id))
        if raw:
            beats.append(PodHeartbeat.from_hash(raw))
    return beats


async def read_pools(redis: aioredis.Redis) -> list[str]:
    return sorted(_text(p) for p in await redis.smembers(POOLS_KEY))
