"""A pool's unmet demand in Redis: clients waiting for a slot and clients refused one.

Routers write both (the Lua scripts of :mod:`asrpool.router.scripts` are given these
names); the operator reads them to grow a pool, or to wake one at
zero, before any stream runs on it.

| key | type | content |
| --- | --- | --- |
| ``asrpool:{POOL}:queue:leases`` | zset | waiting tickets, scored by lease deadline |
| ``asrpool:{POOL}:refused`` | zset | refused requests, scored by the refusal time |

A pool with no pod yet is unknown to the routers (they answer ``unknown_pool``, and
nobody waits); the operator announces an autoscaled pool (``asrpool:{POOL}:known``,
``registry.announce``) so that its clients wait or are refused ``busy``, and count.

Refusals older than :data:`REFUSALS_KEPT_MS` are trimmed at each refusal, and the key
expires after that long without one. Every time is Redis's own (``TIME``).
"""

from __future__ import annotations

import dataclasses

import redis.asyncio as aioredis

from asrpool.common import registry

REFUSALS_KEPT_MS = 300_000


def queue_leases_key(pool: str) -> str:
    return f"{registry.pool_tag(pool)}:queue:leases"


def refusals_key(pool: str) -> str:
    return f"{registry.pool_tag(pool)}:refused"


@dataclasses.dataclass(frozen=True)
class Unmet:
    waiting: int = 0  # clients in the pool's wait queue now
    refused: int = 0  # requests refused 'busy' within the window read


async def read(redis: aioredis.Redis, pool: str, window_seconds: float) -> Unmet:
    """Waiting clients now, and requests refused in the last ``window_seconds``."""
    now = await registry.redis_now_ms(redis)
    since = now - int(window_seconds * 1000)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zcount(queue_leases_key(pool), now, "+inf")
        pipe.zcount(refusals_key(pool), since, "+inf")
        waiting, refused = await pipe.execute()
    return Unmet(waiting=int(waiting), refused=int(refused))

