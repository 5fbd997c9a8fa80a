"""Prompt pool membership: routers learn of a pod as it gets its IP, not at the next pass.

Routers admit a stream only to a pod the operator lists for its pool
(``registry.publish_members``: pod id to pod IP). Each pass lists the pool's pods and
publishes them (``reconciling``), whatever was published before: it repairs a Redis that
lost the list. Between passes a kopf index keeps every server pod's IP under its pool
(:func:`index_entry`), and a handler on those pods' events republishes the pool's list
when it differs from the last one written: a pod that gets or loses its IP, or is
deleted. That costs no API call and no reconcile, and at most one Redis write an event.

Writes keep their order (one lock), and a pool's list is read from the index under it,
so an older list never overwrites a newer one.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import kopf
import redis
import redis.asyncio as aioredis

from asrpool.common import registry
from asrpool.operator import naming

# The pods that a pool's Deployment makes (naming.selector), whatever their pool.
SERVER_PODS: dict[str, Any] = {naming.NAME_LABEL: naming.SERVER_APP,
                               naming.POOL_LABEL: kopf.PRESENT}
PoolKey = tuple[str, str]  # (namespace, pool name)
INDEX = "server_pod_ips"  # the index's id: kopf passes it to handlers under this name


def index_entry(namespace: str, name: str, labels: Mapping[str, str],
                status: Mapping[str, Any]) -> dict[PoolKey, tuple[str, str]]:
    """A server pod in the index: under its pool, its id (naming.pod_id) and IP; nothing
    without an IP (an empty dict, which takes the pod out of the index: kopf keeps a
    pod's old entry when an indexer returns None)."""
    ip = status.get("podIP")
    if not ip:
        return {}
    return {(namespace, labels[naming.POOL_LABEL]): (naming.pod_id(namespace, name), str(ip))}


@dataclasses.dataclass
class Published:
    """What this operator last wrote for each pool, and the lock its writes go under."""

    lists: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)

    async def publish(self, redis_client: aioredis.Redis, pool: str,
                      members: Callable[[], dict[str, str]], *, always: bool = False) -> bool:
        """Write ``members()`` (read under the lock) as the pool's list, when it differs
        from the last written or ``always``. Whether it was written: a Redis that cannot
        be written keeps its last list, and the next event or pass tries again."""
        async with self.lock:
            wanted = members()
            if not always and self.lists.get(pool) == wanted:
                return False
            self.lists.pop(pool, None)  # unknown until the write succeeds
            try:
                await registry.publish_members(redis_client, pool, wanted)
            except (redis.RedisError, OSError):
                return False
            self.lists[pool] = wanted
            return True


def pool_members(index: Mapping[PoolKey, Any], key: PoolKey) -> dict[str, str]:
    """The pool's pods with an IP, from the index (pod id to IP)."""
    return dict(index.get(key, ()))
