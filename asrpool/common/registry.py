"""The Redis slot registry: the key schema that server pods write and routers read.

Every key of one pool starts with ``asrpool:{POOL}`` (:func:`pool_tag`: one Redis Cluster
hash slot per pool, so that the scripts can run on a cluster). Every server pod
heartbeats (at least once a second) into:

- ``asrpool:{POOL}:pod:{pod_id}``: a hash with the fields of :class:`PodHeartbeat`, on a
  lease (``PEXPIRE``) so that a dead pod's hash vanishes within a few seconds;
- ``asrpool:{POOL}:pods``: a sorted set of the pool's pod ids scored by the
  lease deadline in Unix milliseconds, so readers can drop dead pods without ``SCAN``;
- ``asrpool:{POOL}:known``, set, and ``asrpool:pools``, the set of pool names seen, to
  which the pool is added (by each beat, unless the pod is told not to: under Redis
  ACLs a pod reaches only its own namespace's keys, and whoever publishes a pool's
  members announces the pool instead). The routers' ADMIT checks ``known``, in the
  pool's slot; the pools set, in a slot of its own, only lists pools for readers.

A heartbeat alone does not make a pod. Whoever knows the pool's real pods (the operator
from the cluster's pod list, the local platform from its own children) publishes them in
``asrpool:{POOL}:members``, a hash of pod id to IP address; once it exists, routers
admit only to a pod listed there whose heartbeat's address has that IP, so a process
that writes a heartbeat (even under a real pod's id) receives no audio.

Readers must treat a pod as alive only while its hash exists and its score in the
pool set is in the future. Every time in these keys is Redis's own (``TIME``), never a
pod's clock, so a skewed pod cannot make itself immortal or dead to the routers.

One pod id, one process: ``asrpool:{POOL}:pod:{pod_id}:owner`` names the process (a random
instance id) that holds the id, on the same lease. A process claims it at start
(:func:`claim_at_start`, waiting out at most one lease of a crashed predecessor),
renews it with every beat, and its writes and its removal at exit touch the pod's keys
only while it owns them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as redis_exceptions

KEY_PREFIX = "asrpool"
POOLS_KEY = f"{KEY_PREFIX}:pools"
DEFAULT_POOL = "default"
DEFAULT_LEASE_MS = 3000
# Pods of a pool that routers read per pass (the latest leases): a pool of 1,024-slot
# pods reaches four million slots, one of 8-slot pods 32,768.
MAX_PODS_READ = 4096


def in_namespace(namespace: str, name: str) -> str:
    """A Kubernetes object's name in the registry, ``NAMESPACE/NAME``: the name of a
    ``StreamingASRPool``'s pool and the id of its server pods, so that two namespaces'
    pools or pods of one name never meet (and a namespace's Redis user can be given
    exactly its own keys: asrpool.common.redis_acl)."""
    return f"{namespace}/{name}"


def pool_tag(pool: str) -> str:
    """The start of every key of one pool, ``asrpool:{POOL}``: Redis Cluster hashes only
    what is between the braces, so all of a pool's keys are in one slot and a script
    may touch any of them (pool names are DNS names, ``NAMESPACE/NAME``: no brace)."""
    return f"{KEY_PREFIX}:{{{pool}}}"


def pod_key(pool: str, pod_id: str) -> str:
    return f"{pool_tag(pool)}:pod:{pod_id}"


def pool_pods_key(pool: str) -> str:
    return f"{pool_tag(pool)}:pods"


def pool_members_key(pool: str) -> str:
    return f"{pool_tag(pool)}:members"


def pool_known_key(pool: str) -> str:
    """Set while the pool is known to the routers (ADMIT checks it, in the pool's slot;
    :data:`POOLS_KEY` lists the pools for readers and is never in a script)."""
    return f"{pool_tag(pool)}:known"


# A field no pod id can be (pod ids are DNS labels, or NAMESPACE/NAME of two): keeps the
# hash of a pool whose pods are all gone, so that an empty list still means "no pod",
# not "not listed".
MEMBERS_SENTINEL = "*"


async def publish_members(redis: aioredis.Redis, pool: str, members: dict[str, str]) -> None:
    """Replace the pool's list of real pods (pod id to IP address), atomically, and make
    the pool known (its pods may not: ``write_heartbeat``'s ``announce``)."""
    key = pool_members_key(pool)
    fields: dict[Any, Any] = {MEMBERS_SENTINEL: "", **members}
    async with redis.pipeline(transaction=True) as tx:
        tx.delete(key)
        tx.hset(key, mapping=fields)
        tx.set(pool_known_key(pool), "1")
        await tx.execute()
    await redis.sadd(POOLS_KEY, pool)


async def announce(redis: aioredis.Redis, pool: str) -> None:
    """Make the pool known to the routers (its ``known`` key, in its slot) and list it
    in the pools set (another slot, so a second command)."""
    await redis.set(pool_known_key(pool), "1")
    await redis.sadd(POOLS_KEY, pool)


def pod_owner_key(pool: str, pod_id: str) -> str:
    return f"{pod_key(pool, pod_id)}:owner"


def now_ms() -> int:
    """This process's clock: for its own timers only, never against times in Redis."""
    return int(time.time() * 1000)


async def redis_now_ms(redis: aioredis.Redis) -> int:
    """Redis's own clock (``TIME``), the one every lease and score in Redis is set by."""
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def new_instance() -> str:
    """A process's own id, to tell it apart from another process of the same pod id."""
    return uuid.uuid4().hex


class PodIdTaken(RuntimeError):
    """Another live process holds this pod id."""


class MalformedHeartbeat(ValueError):
    """A pod's record that is not a heartbeat (a field missing, or not a number where
    one is due): skipped by every reader, never taken for a pod."""


_MAX_SLOTS = 1 << 20  # no pod has more; a larger figure is a forged or broken record


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
    overloaded: bool = False  # behind real time: takes no new stream (as draining)
    updated_ms: int = 0

    @property
    def used_slots(self) -> int:
        return self.total_slots - self.free_slots

    def to_hash(self) -> dict[str, str]:
        fields = dataclasses.asdict(self)
        fields["draining"] = "1" if self.draining else "0"
        fields["overloaded"] = "1" if self.overloaded else "0"
        return {name: str(value) for name, value in fields.items()}

    @classmethod
    def from_hash(cls, raw: dict[Any, Any]) -> PodHeartbeat:
        """Raises :class:`MalformedHeartbeat`, naming the field."""
        fields = {as_text(k): as_text(v) for k, v in raw.items()}
        missing = [name for name in ("pod_id", "pool", "address", "total_slots",
                                     "free_slots", "draining") if name not in fields]
        if missing:
            raise MalformedHeartbeat(f"no {', '.join(missing)}")
        total = _count(fields, "total_slots", _MAX_SLOTS)
        return cls(
            pod_id=fields["pod_id"],
            pool=fields["pool"],
            address=fields["address"],
            total_slots=total,
            free_slots=_count(fields, "free_slots", total),
            draining=fields["draining"] == "1",
            model=fields.get("model", ""),
            overloaded=fields.get("overloaded", "0") == "1",
            updated_ms=_count(fields, "updated_ms", 1 << 62, "0"),
        )


def _count(fields: dict[str, str], name: str, most: int, default: str | None = None) -> int:
    text = fields.get(name, default)
    if text is None or not text.isascii() or not text.isdigit() or int(text) > most:
        raise MalformedHeartbeat(f"{name}={text!r} is not a count from 0 to {most}")
    return int(text)


def as_text(value: Any) -> str:
    """A Redis reply as text, from a client that decodes responses or one that does not."""
    return value.decode() if isinstance(value, bytes) else str(value)


async def write_heartbeat(
    redis: aioredis.Redis, beat: PodHeartbeat, lease_ms: int = DEFAULT_LEASE_MS,
    instance: str = "", *, announce: bool = True,
) -> bool:
    """Publish one heartbeat atomically (hash, lease, pool membership), timed by Redis,
    and with ``announce`` make its pool known (:func:`announce`). With an ``instance``,
    only while that process owns the pod id: False if another does."""
    fields: dict[Any, Any] = beat.to_hash()
    now = await redis_now_ms(redis)
    fields["updated_ms"] = now
    pod, pool_set = pod_key(beat.pool, beat.pod_id), pool_pods_key(beat.pool)

    def writes(tx: Any) -> None:
        tx.hset(pod, mapping=fields)
        tx.pexpire(pod, lease_ms)
        tx.zadd(pool_set, {beat.pod_id: now + lease_ms})
        if announce:
            tx.set(pool_known_key(beat.pool), "1")

    written = await _as_owner(redis, pod_owner_key(beat.pool, beat.pod_id), instance,
                              lease_ms, writes)
    if written and announce:
        await redis.sadd(POOLS_KEY, beat.pool)  # another slot: not in the transaction
    return written


async def claim(redis: aioredis.Redis, pool: str, pod_id: str, instance: str,
                lease_ms: int = DEFAULT_LEASE_MS) -> bool:
    """Hold (or renew) the pod id in its pool for this process; False while another
    process does."""
    return await _as_owner(redis, pod_owner_key(pool, pod_id), instance, lease_ms,
                           lambda tx: None)


async def _as_owner(redis: aioredis.Redis, owner: str, instance: str, lease_ms: int | None,
                    writes: Callable[[Any], None]) -> bool:
    """Run ``writes`` in one transaction while this process owns the pod id (or nobody
    does: it takes the id, for ``lease_ms``), or with no ``instance`` at all; False,
    writing nothing, while another process owns it. The owner is watched, so a change
    between the check and the writes fails the transaction, which is tried again. No
    script: a namespace's pod user may run none (``redis_acl``), as a script that
    writes and then loops would stall every client of the Redis."""
    async with redis.pipeline(transaction=True) as pipeline:
        tx: Any = pipeline  # a cluster's pipeline or a server's, as the client is
        while True:
            try:
                if instance:
                    await tx.watch(owner)
                    held = await tx.get(owner)
                    if held is not None and as_text(held) != instance:
                        await tx.reset()
                        return False
                    tx.multi()
                    if lease_ms is not None:
                        tx.set(owner, instance, px=lease_ms)
                writes(tx)
                await tx.execute()
                return True
            except redis_exceptions.WatchError:
                continue


async def claim_at_start(redis: aioredis.Redis, pool: str, pod_id: str, instance: str,
                         lease_ms: int = DEFAULT_LEASE_MS, poll_s: float = 0.1) -> None:
    """Claim the id, waiting out at most one lease (a crashed predecessor's record lapses;
    a live pod renews its own). Raises :class:`PodIdTaken` if it stays held."""
    deadline = time.monotonic() + lease_ms / 1000 + 1.0
    while not await claim(redis, pool, pod_id, instance, lease_ms):
        if time.monotonic() > deadline:
            raise PodIdTaken(
                f"pod id {pod_id!r} is held by a live pod (its record in Redis was renewed "
                f"for over {lease_ms} ms): give every pod its own --pod-id")
        await asyncio.sleep(poll_s)


async def remove_pod(redis: aioredis.Redis, pod_id: str, pool: str, instance: str = "") -> bool:
    """Withdraw a pod at a clean exit, without waiting for its lease; with an
    ``instance``, only the record that process owns (False: another process's, kept)."""
    owner, pod, pool_set = pod_owner_key(pool, pod_id), pod_key(pool, pod_id), pool_pods_key(pool)

    def writes(tx: Any) -> None:
        tx.delete(owner, pod)
        tx.zrem(pool_set, pod_id)

    return await _as_owner(redis, owner, instance, None, writes)


async def read_pool(redis: aioredis.Redis, pool: str,
                    malformed: list[str] | None = None) -> list[PodHeartbeat]:
    """The live pods of a pool (lease not expired), dropping dead members on the way. A
    record that is no heartbeat is skipped (said in ``malformed``: pod id and why)."""
    await redis.zremrangebyscore(pool_pods_key(pool), "-inf", await redis_now_ms(redis))
    beats = []
    for pod_id in await listed_pods(redis, pool):
        raw = await redis.hgetall(pod_key(pool, pod_id))
        if not raw:
            continue
        try:
            beats.append(PodHeartbeat.from_hash(raw))
        except MalformedHeartbeat as exc:
            if malformed is not None:
                malformed.append(f"{pod_id}: {exc}")
    return beats


async def listed_pods(redis: aioredis.Redis, pool: str) -> list[str]:
    """The pod ids in the pool's lease set, dead ones too until someone drops them: the
    :data:`MAX_PODS_READ` latest leases at most, oldest first. Whoever may write a
    pool's lease set (its pods' Redis user) can fill it; every router reads it every
    second, so what it reads is bounded, and a flooded pool hurts only itself."""
    newest = await redis.zrange(pool_pods_key(pool), 0, MAX_PODS_READ - 1, desc=True)
    return [as_text(p) for p in reversed(newest)]


async def unread_pods(redis: aioredis.Redis, pool: str) -> int:
    """Entries of the pool's lease set beyond what :func:`listed_pods` reads."""
    return max(0, int(await redis.zcard(pool_pods_key(pool))) - MAX_PODS_READ)


async def read_pools(redis: aioredis.Redis) -> list[str]:
    return sorted(as_text(p) for p in await redis.smembers(POOLS_KEY))
