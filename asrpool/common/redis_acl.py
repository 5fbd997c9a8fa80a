"""Redis users per pool namespace: a pod's credentials reach its own namespace's pools only.

With one Redis password for everyone, whoever can read a Secret in one pool's namespace
can write any pool's keys: register a "pod" into another namespace's pool, rewrite its
member list, or its routers' sessions. Under ACLs the operator gives each pool namespace
its own Redis user (:func:`pod_user`), which it creates and keeps with ``ACL SETUSER`` at
every pass (a restarted Redis has it again within one pass), whose keys are only those a
server pod writes for a pool of that namespace (registry: pod ids and pool names are
NAMESPACE/NAME there):

- ``asrpool:{NS/*}:pod:NS/*``: the pod's heartbeat hash and its owner key, in a pool
  of the namespace (every key of a pool starts ``asrpool:{POOL}``: registry.pool_tag;
  the routers' session counts of a pod are ``pod-sessions:``, out of reach);
- ``asrpool:{NS/*}:pods``: its pool's lease set.

A glob's ``*`` crosses the closing brace, but what a key's brace opens with fixes its
pool's namespace: a key these patterns match is always one of the namespace's pools.

Not the members list (the operator's), the pools set (the operator adds the pool as it
lists the members), sessions, API keys or queues. The commands are the few that the
pod's transactions and its connection use; no keyless command that could touch another
namespace (``FLUSHALL``, ``SCRIPT FLUSH``, ``KEYS``, ``CLIENT KILL``, ``ACL``), no
script (``EVAL``: a script that writes and then loops cannot be killed) and no channel.
Works on Redis 6.2 and later, and on a Redis Cluster, where the user is set on every
node.

The password is derived from the operator's seed (asrpool.common.seeds) and sent to
Redis only as its SHA-256 (``#hash``).
"""

from __future__ import annotations

import hashlib

import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster

from asrpool.common import redis_clients, registry

POD_USER_PREFIX = "asrpool-pods-"
# What a server pod sends: its transactions (registry: claim, beat, remove: the owner
# watched, then the writes), redis-py's connection setup (AUTH, HELLO; CLIENT SETINFO is
# refused, which redis-py ignores), PING, TIME, and on a Redis Cluster the cluster
# client's map of slots to nodes (CLUSTER SLOTS: addresses and slot ranges) and its table
# of commands (COMMAND); no key. No script: one that writes and then loops cannot be
# killed, and every client of the Redis would wait on it.
POD_COMMANDS = ("auth", "hello", "select", "ping", "time", "watch", "unwatch", "multi",
                "exec", "discard", "get", "set", "del", "hset", "pexpire", "zadd", "zrem",
                "cluster|slots", "command")


def pod_user(namespace: str) -> str:
    """The Redis user of the server pods of ``namespace``'s pools."""
    return POD_USER_PREFIX + namespace


def pod_key_patterns(namespace: str) -> list[str]:
    """The keys that user may touch (the namespace is a DNS label: no glob characters)."""
    pools = registry.pool_tag(f"{namespace}/*")
    return [f"{pools}:pod:{namespace}/*", f"{pools}:pods"]


def pod_user_rules(namespace: str, password: str) -> list[str]:
    """The whole user, from nothing (``reset``): setting it again changes nothing."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    return ["reset", "on", f"#{digest}", "resetchannels",
            *(f"~{pattern}" for pattern in pod_key_patterns(namespace)),
            "-@all", *(f"+{command}" for command in POD_COMMANDS)]


async def ensure_pod_user(redis: aioredis.Redis, namespace: str, password: str) -> None:
    """Create or restore ``namespace``'s pod user, exactly (raises Redis's error: a user
    without ACL rights gets ``NoPermissionError``); on a Redis Cluster, on every node,
    and under Sentinel, on the primary and every replica (each keeps its own users, and
    a replica promoted by a failover must have them already)."""
    nodes = {"target_nodes": aiocluster.RedisCluster.ALL_NODES} if redis_clients.is_cluster(
        redis) else {}
    command = ("ACL", "SETUSER", pod_user(namespace), *pod_user_rules(namespace, password))
    await redis.execute_command(*command, **nodes)
    for replica in await redis_clients.replicas(redis):
        try:
            await replica.execute_command(*command)
        finally:
            await replica.aclose()
