"""Redis keys the router adds to the registry (the pods' keys are in ``common.registry``).

| key | type | content |
| --- | --- | --- |
| ``asrpool:{POOL}:session:{sid}`` | hash, lease | the pinning record of one session |
| ``asrpool:{POOL}:session:{sid}:ended`` | string, lease | a released session's tombstone |
| ``asrpool:{POOL}:pod-sessions:{pod}`` | zset | session ids on the pod, scored by end of counting |
| ``asrpool:apikey:{KEY}:sessions`` | zset | session ids of one API key, scored by lease deadline |
| ``asrpool:{POOL}:queue`` | zset | waiting tickets, scored by arrival order |
| ``asrpool:{POOL}:queue:leases`` | zset | waiting tickets, scored by lease deadline |
| ``asrpool:{POOL}:queue:key:{key}`` | zset | one key's waiting tickets, by lease deadline |
| ``asrpool:{POOL}:queue:seq`` | counter | the last arrival number given |

``{POOL}`` is the pool's name inside real braces (``registry.pool_tag``): all of one
pool's keys are in one Redis Cluster slot (``{sid}``, ``{pod}`` and ``{key}`` stand for
values, without braces). An API key's count crosses pools, so it is in a slot of its
own, ``{KEY}`` (the key's id inside real braces), touched by scripts of its own
(KEY_RESERVE, KEY_HOLD, KEY_DROP in :mod:`asrpool.router.scripts`). A pod's session
count is ``pod-sessions:{pod}``, not under ``pod:{pod}``, so that the namespace's pod
user (whose keys are ``asrpool:{NS/*}:pod:NS/*``: ``common.redis_acl``) cannot reach it.

The zsets carry a TTL as long as their last member counts (the queue and its counter as
long as their last waiter polls), so the keys of dead pods
and idle API keys vanish by themselves. These builders are the only place the names are
written: the Lua scripts are given every key they touch (:mod:`asrpool.router.scripts`).
"""

from __future__ import annotations

from asrpool.common import registry

P = registry.KEY_PREFIX


def session(pool: str, sid: str) -> str:
    return f"{registry.pool_tag(pool)}:session:{sid}"


def ended(pool: str, sid: str) -> str:
    return f"{session(pool, sid)}:ended"


def pod_sessions(pool: str, pod_id: str) -> str:
    return f"{registry.pool_tag(pool)}:pod-sessions:{pod_id}"


def key_sessions(key_id: str) -> str:
    return f"{P}:apikey:{{{key_id}}}:sessions"


def pool_queue(pool: str) -> str:
    return f"{registry.pool_tag(pool)}:queue"


def queue_seq(pool: str) -> str:
    return f"{pool_queue(pool)}:seq"


def key_queue(pool: str, key_id: str) -> str:
    return f"{pool_queue(pool)}:key:{key_id}"
