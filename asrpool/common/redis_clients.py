"""One way to make a Redis client: every call has a deadline.

A Redis that stops answering must cost a bounded wait, never a hang: the operator holds
a pool's lock during a pass, a pod's heartbeat and a router's admission are on the hot
path. One retry covers a connection left stale by a Redis restart.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis import backoff, retry


def connect(url: str, timeout_seconds: float, *, decode_responses: bool = False
            ) -> aioredis.Redis:
    return aioredis.Redis.from_url(
        url, decode_responses=decode_responses, socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds, retry=retry.Retry(backoff.NoBackoff(), 1))
