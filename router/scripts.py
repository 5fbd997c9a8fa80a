"""The router's Lua scripts: every change to admission state is one atomic script.

Redis runs a script alone, so two routers racing for the last slot of a pod see each
other's reservations: the pod is never given more streams than it has slots. Time is
Redis's own (``TIME``), so routers on skewed clocks agree on lease deadlines.

Each script has a typed codec: a ``...Keys`` tuple of every key it touches, built by the
Python key builders (:mod:`asrpool.router.keys`, :mod:`asrpool.common.registry`,
:mod:`asrpool.common.waiting`) and passed in ``KEYS`` (no script builds a key name), a
``...Args`` tuple for ``ARGV``, and a reply decoder. The Lua reads both by position, so
the order of a tuple's fields is the script's calling convention: change them together.
A script whose keys depend on Redis's contents (ADMIT's pods, RESUME's pod) is given
them by its caller, which read them first, and checks them against what it finds.

Every script's keys are in one Redis Cluster slot: a pool's scripts touch only that
pool's keys (``asrpool:{POOL}:...``), and an API key's count, which crosses pools, has
scripts of its own in its own slot (KEY_RESERVE before ADMIT, KEY_DROP when ADMIT
refuses or the session ends, KEY_HOLD after each script that keeps a session). So a
key's ``max_streams`` is no longer checked in the same atomic step as the pod's slot:
it is reserved first, conservatively (two admissions racing for a key's last stream
never both get it; one may be refused though the other then fails to find a slot),
and a release racing a renewal of the same session may leave it counted against its
key until its hold ends.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

from asrpool.common import protocol, registry, waiting
from asrpool.router import keys

Argv = list[str | int]


class Denial(enum.StrEnum):
    """Why a script refused, as its reply says it: each is one of the client's refusals
    (placing.refusal_for), most of them under the code the client is told."""

    BUSY = protocol.ErrorCode.BUSY
    UNKNOWN_POOL = protocol.ErrorCode.UNKNOWN_POOL
    KEY_LIMIT = protocol.ErrorCode.KEY_LIMIT
    QUEUE_FULL = protocol.ErrorCode.QUEUE_FULL
    KEY_QUEUE_FULL = protocol.ErrorCode.KEY_QUEUE_FULL
    BAD_RESUME_TOKEN = protocol.ErrorCode.BAD_RESUME_TOKEN
    POD_GONE = "pod_gone"  # told as pod_lost


class Renewed(enum.IntEnum):
    """A lease renewal's answer (RENEW_MANY, RENEW_WHOLE)."""

    TAKEN = 0  # claimed by another connection, or released: it stays so
    RENEWED = 1
    POD_SILENT = 2  # renewed, but the pod's heartbeat has lapsed
    LOST = 3  # Redis lost the record: ask again with its fields


class Kept(enum.IntEnum):
    """KEEP_DETACHED's answer."""

    GONE = 0  # resumed, released or claimed by another router: no longer this one's
    KEPT = 1
    LOST = 3  # Redis lost the record: ask again with its fields


_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- keep a key at least ms longer (never shorten it): keys of dead pods and keys vanish
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end
-- count a session in a zset until the given time
local function count(key, until_ms, sid)
  redis.call('ZADD', key, until_ms, sid)
  keep(key, until_ms - now)
end
-- a request of the pool refused 'busy', for the operator's demand (common.waiting)
local function refused(key, id)
  redis.call('ZADD', key, now, id)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - REFUSALS_KEPT_MS)
  redis.call('PEXPIRE', key, REFUSALS_KEPT_MS)
end
""".replace("REFUSALS_KEPT_MS", str(waiting.REFUSALS_KEPT_MS))


class SessionKeys(NamedTuple):
    """The keys of one session's record and its pod's count (all in its pool's slot):
    every script of one session takes them first, in this order."""

    session: str
    ended: str  # the tombstone of a released session
    pod_sessions: str

    @classmethod
    def of(cls, pool: str, sid: str, pod_id: str) -> SessionKeys:
        return cls(keys.session(pool, sid), keys.ended(pool, sid),
                   keys.pod_sessions(pool, pod_id))


class KeyArgs(NamedTuple):
    """KEY_RESERVE's ARGV, in order (its KEYS: the API key's ``keys.key_sessions``)."""

    sid: str
    limit: int  # 0: no limit
    pending_ms: int


# Count a new session against its API key, unless the key already has ``limit``
# sessions (another session's count, not this one's). Returns 1 when counted.
KEY_RESERVE = _PRELUDE + """
local sid, limit = ARGV[1], tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if limit > 0 and not redis.call('ZSCORE', KEYS[1], sid)
    and redis.call('ZCARD', KEYS[1]) >= limit then
  return 0
end
count(KEYS[1], now + tonumber(ARGV[3]), sid)
return 1
"""

# Count sessions of one API key for ms more. ARGV: ms, then the session ids.
KEY_HOLD = _PRELUDE + """
local until_ms = now + tonumber(ARGV[1])
for i = 2, #ARGV do count(KEYS[1], until_ms, ARGV[i]) end
return 1
"""

# Stop counting sessions against their API key. ARGV: the session ids.
KEY_DROP = """
return redis.call('ZREM', KEYS[1], unpack(ARGV))
"""


class AdmitKeys(NamedTuple):
    """ADMIT's KEYS, in order (all in the pool's slot); each candidate pod's hash and
    session count follow."""

    known: str
    pool_pods: str
    members: str
    queue: str
    queue_leases: str
    queue_seq: str
    key_queue: str
    refused: str
    session: str

    @classmethod
    def of(cls, pool: str, sid: str, key_id: str) -> AdmitKeys:
        return cls(registry.pool_known_key(pool), registry.pool_pods_key(pool),
                   registry.pool_members_key(pool), keys.pool_queue(pool),
                   waiting.queue_leases_key(pool), keys.queue_seq(pool),
                   keys.key_queue(pool, key_id), waiting.refusals_key(pool),
                   keys.session(pool, sid))

    def with_pods(self, pool: str, pod_ids: Sequence[str]) -> list[str]:
        return [*self, *(k for pod_id in pod_ids for k in (registry.pod_key(pool, pod_id),
                                                            keys.pod_sessions(pool, pod_id)))]


class AdmitArgs(NamedTuple):
    """ADMIT's ARGV, in order; the candidate pods' ids follow (in the order of their keys)."""

    sid: str
    key_id: str  # its queue, and the record (its count: KEY_RESERVE before ADMIT)
    policy: str
    hold_ms: int
    ticket: str
    ticket_lease_ms: int
    router: str
    token_sha: str
    conn: str
    pending_ms: int  # how long a reservation counts before the pod has accepted it
    queue_max: int  # waiters a pool's queue holds at most (a new one beyond: queue_full)
    queue_max_per_key: int  # waiters of one API key at most (beyond: key_queue_full); 0: any
    members_required: int  # 1: a pool whose pods are not listed has none (0: any heartbeat)
    pool: str

    def with_pods(self, pod_ids: Sequence[str]) -> Argv:
        return [*self, *pod_ids]


class AdmitReply(NamedTuple):
    """ADMIT's reply: {'ok', pod_id, address, now_ms} | {'busy', rank} | {denial}."""

    denial: Denial | None  # None: admitted
    pod_id: str = ""
    address: str = ""
    now_ms: int = 0
    rank: int | None = None

    @classmethod
    def decode(cls, reply: list[str]) -> AdmitReply:
        if reply[0] == "ok":
            return cls(None, reply[1], reply[2], int(reply[3]))
        return cls(Denial(reply[0]), rank=int(reply[1]) if len(reply) > 1 else None)


# The load of one pod, mirroring policies.effective_used. Returns nil for a pod whose
# heartbeat hash has expired.
_LOAD = """
local function load(pod_id, hash, sessions)
  local h = redis.call('HMGET', hash, 'total_slots', 'free_slots', 'draining', 'address',
                       'overloaded')
  if not h[1] or not h[2] or not h[4] then return nil end
  -- a record that is no heartbeat (a forged or broken field) is no pod
  if not tonumber(h[1]) or not tonumber(h[2]) then return nil end
  local total = tonumber(h[1])
  redis.call('ZREMRANGEBYSCORE', sessions, '-inf', now)
  local used = math.max(total - tonumber(h[2]), redis.call('ZCARD', sessions))
  return {id = pod_id, address = h[4], total = total, sessions = sessions,
          -- an overloaded pod (behind real time) takes no new stream, as a draining one
          free = math.max(0, total - used), draining = h[3] == '1' or h[5] == '1'}
end
"""

ADMIT = _PRELUDE + _LOAD + """
local K_KNOWN, K_PODS, K_MEMBERS, K_QUEUE, K_LEASES, K_SEQ, K_KEY_QUEUE, K_REFUSED,
  K_SESSION = unpack(KEYS, 1, 9)
local sid, key_id, policy = ARGV[1], ARGV[2], ARGV[3]
local hold_ms = tonumber(ARGV[4])
local ticket, ticket_lease_ms = ARGV[5], tonumber(ARGV[6])
local queue_max, queue_max_per_key = tonumber(ARGV[11]), tonumber(ARGV[12])
local members_required, pool = ARGV[13] == '1', ARGV[14]
local FIRST_POD, FIRST_POD_KEY = 15, 10

if redis.call('EXISTS', K_KNOWN) == 0 then return {'unknown_pool'} end

redis.call('ZREMRANGEBYSCORE', K_PODS, '-inf', now)
-- a heartbeat alone does not make a pod: once the pool's real pods are listed (by the
-- operator or the local platform), only a listed pod at its listed IP is admitted to
local listed = redis.call('EXISTS', K_MEMBERS) == 1
local function real(pod)
  if not listed then return not members_required end
  local ip = redis.call('HGET', K_MEMBERS, pod.id)
  return ip ~= false and ip ~= '' and string.match(pod.address, '^(.*):%d+$') == ip
end
local best = nil
local free_total = 0
for i = FIRST_POD, #ARGV do
  local pod_id = ARGV[i]
  local k = FIRST_POD_KEY + 2 * (i - FIRST_POD)
  local pod = redis.call('ZSCORE', K_PODS, pod_id) and load(pod_id, KEYS[k], KEYS[k + 1])
  if pod and not pod.draining and pod.free > 0 and real(pod) then
    free_total = free_total + pod.free
    if best == nil then
      best = pod
    elseif policy == 'pack' then
      if pod.free < best.free or (pod.free == best.free and pod.id < best.id) then best = pod end
    else
      if pod.free > best.free or (pod.free == best.free and pod.id < best.id) then best = pod end
    end
  end
end

for _, gone in ipairs(redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', now)) do
  redis.call('ZREM', K_QUEUE, gone)
  redis.call('ZREM', K_LEASES, gone)
end
local rank
if ticket ~= '' then
  if not redis.call('ZSCORE', K_QUEUE, ticket) then
    if redis.call('ZCARD', K_QUEUE) >= queue_max then return {'queue_full'} end
    if key_id ~= '' and queue_max_per_key > 0 then
      redis.call('ZREMRANGEBYSCORE', K_KEY_QUEUE, '-inf', now)
      if redis.call('ZCARD', K_KEY_QUEUE) >= queue_max_per_key then return {'key_queue_full'} end
    end
    redis.call('ZADD', K_QUEUE, redis.call('INCR', K_SEQ), ticket)
  end
  -- every poll keeps the queue and its counter alive: a queue (or counter) that expired
  -- under waiting tickets would number them again in the order of their next polls
  count(K_LEASES, now + ticket_lease_ms, ticket)
  keep(K_QUEUE, ticket_lease_ms)
  keep(K_SEQ, ticket_lease_ms)
  if key_id ~= '' then count(K_KEY_QUEUE, now + ticket_lease_ms, ticket) end
  rank = redis.call('ZRANK', K_QUEUE, ticket)
else
  rank = redis.call('ZCARD', K_QUEUE)
end
if best == nil or rank >= free_total then
  if ticket == '' then refused(K_REFUSED, sid) end  -- a waiting client counts once it gives up
  return {'busy', tostring(rank)}
end
if ticket ~= '' then
  redis.call('ZREM', K_QUEUE, ticket)
  redis.call('ZREM', K_LEASES, ticket)
  redis.call('ZREM', K_KEY_QUEUE, ticket)
end

count(best.sessions, now + tonumber(ARGV[10]), sid)
redis.call('HSET', K_SESSION, 'session_id', sid, 'pool', pool, 'pod', best.id,
  'address', best.address, 'key_id', key_id, 'started_ms', now, 'router', ARGV[7],
  'token_sha', ARGV[8], 'conn', ARGV[9], 'state', 'reserved')
redis.call('PEXPIRE', K_SESSION, hold_ms)
return {'ok', best.id, best.address, tostring(now)}
"""


class LeaveKeys(NamedTuple):
    """LEAVE_QUEUE's KEYS, in order."""

    queue: str
    queue_leases: str
    key_queue: str
    refused: str

    @classmethod
    def of(cls, pool: str, key_id: str) -> LeaveKeys:
        return cls(keys.pool_queue(pool), waiting.queue_leases_key(pool),
                   keys.key_queue(pool, key_id), waiting.refusals_key(pool))


class LeaveArgs(NamedTuple):
    """LEAVE_QUEUE's ARGV, in order."""

    ticket: str
    refused: int  # 1: the client is told 'busy': left for the operator as demand


# Leave the wait queue (a waiter gave up, or its client left): at once, so that no
# one behind it waits for a ticket nobody will use.
LEAVE_QUEUE = _PRELUDE + """
for i = 1, 3 do redis.call('ZREM', KEYS[i], ARGV[1]) end
if ARGV[2] == '1' then refused(KEYS[4], ARGV[1]) end
return 1
"""


class AttachArgs(NamedTuple):
    """ATTACH's ARGV, in order (its KEYS: the session's :class:`SessionKeys`)."""

    sid: str
    conn: str
    hold_ms: int
    pod_resume_token: str
    pod_session_id: str
    earlier_samples: int  # a moved stream's (admissions.Earlier)
    earlier_messages: int


# The pod accepted the stream: it now holds the slot, for its resume grace even if this
# router dies, so the session counts for the whole hold. Returns 0 when the session is
# no longer this connection's.
ATTACH = _PRELUDE + """
if redis.call('HGET', KEYS[1], 'conn') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'attached', 'pod_resume_token', ARGV[4],
  'pod_session_id', ARGV[5], 'earlier_samples', ARGV[6], 'earlier_messages', ARGV[7])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
count(KEYS[3], now + tonumber(ARGV[3]), ARGV[1])
return 1
"""

# Renew one session's lease (see :class:`Renewed`); ``k`` is the index of its first key
# (SessionKeys, then its pod's hash) and ``fields`` its record's field/value pairs, when
# they are to be written back. ``alive`` caches each pod's heartbeat over one script.
_RENEW_ONE = """
local function renew(k, sid, conn, hold_ms, fields, alive)
  local skey, pod_hash = KEYS[k], KEYS[k + 3]
  local owner = redis.call('HGET', skey, 'conn')
  if owner and owner ~= conn then return 0 end
  if redis.call('EXISTS', KEYS[k + 1]) == 1 then return 0 end
  if not owner then
    if not fields then return 3 end
    redis.call('HSET', skey, 'conn', conn, unpack(fields))
  end
  redis.call('PEXPIRE', skey, hold_ms)
  count(KEYS[k + 2], now + hold_ms, sid)
  if alive[pod_hash] == nil then alive[pod_hash] = redis.call('EXISTS', pod_hash) == 1 end
  if not alive[pod_hash] then return 2 end
  return 1
end
"""


class RenewArgs(NamedTuple):
    """One session: its sid and conn are in RENEW_MANY's ARGV (after the hold), in
    order; its KEYS are its :class:`SessionKeys` and its pod's hash (:meth:`key_names`).
    One call renews sessions of one pool (one slot)."""

    sid: str
    conn: str
    pool: str
    pod: str

    def key_names(self) -> list[str]:
        return session_and_pod_keys(self.pool, self.sid, self.pod)


def session_and_pod_keys(pool: str, sid: str, pod_id: str) -> list[str]:
    """A session's :class:`SessionKeys`, then its pod's hash: RENEW's and RESUME's KEYS."""
    return [*SessionKeys.of(pool, sid, pod_id), registry.pod_key(pool, pod_id)]


RENEW_KEYS = len(SessionKeys._fields) + 1  # KEYS per renewed session


def renew_many(hold_ms: int, sessions: Sequence[RenewArgs]) -> tuple[list[str], Argv]:
    """RENEW_MANY's KEYS and ARGV for these sessions (of one pool)."""
    return ([k for s in sessions for k in s.key_names()],
            [hold_ms, *(value for s in sessions for value in (s.sid, s.conn))])


# Renew many sessions' leases in one call (a router renews all its sessions every
# third of a lease: one command per session cost the relay's loop more than the
# relaying), one call per pool. ARGV: hold_ms, then sid, conn of each session. Returns
# each one's reply (Renewed).
RENEW_MANY = _PRELUDE + _RENEW_ONE + """
local hold_ms, replies, alive = tonumber(ARGV[1]), {}, {}
for i = 2, #ARGV, 2 do
  local k = 1 + RENEW_KEYS * ((i - 2) / 2)
  replies[#replies + 1] = renew(k, ARGV[i], ARGV[i + 1], hold_ms, nil, alive)
end
return replies
""".replace("RENEW_KEYS", str(RENEW_KEYS))


def renew_whole(hold_ms: int, session: RenewArgs, fields: Sequence[str]) -> tuple[list[str], Argv]:
    """RENEW_WHOLE's KEYS and ARGV: the session, then its record's field/value pairs."""
    return session.key_names(), [session.sid, session.conn, hold_ms, *fields]


# Renew one session and write its record back (after RENEW_MANY answered LOST).
RENEW_WHOLE = _PRELUDE + _RENEW_ONE + """
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
return renew(1, ARGV[1], ARGV[2], tonumber(ARGV[3]), fields, {})
"""


class ReleaseArgs(NamedTuple):
    """RELEASE's ARGV, in order (its KEYS: the session's :class:`SessionKeys`)."""

    sid: str
    conn: str
    tombstone_ms: int


# End a session for good. A record another connection has claimed (a resume through
# another router) is left alone. A tombstone (``...:ended``) outlives any lease the
# session had, so a renewal still in flight cannot write the record back (RENEW_WHOLE
# rebuilds only what a Redis restart lost).
RELEASE = """
local owner = redis.call('HGET', KEYS[1], 'conn')
if owner and owner ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], '1', 'PX', tonumber(ARGV[3]))
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""


class DetachArgs(NamedTuple):
    """DETACH's ARGV, in order (its KEYS: the session's :class:`SessionKeys`)."""

    sid: str
    conn: str
    grace_ms: int


# The client went away but the pod keeps the slot for a resume: hold the record (and
# count the slot) for the grace period, owned by no connection.
DETACH = _PRELUDE + """
if redis.call('HGET', KEYS[1], 'conn') ~= ARGV[2] then return 0 end
local grace_ms = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'conn', '', 'state', 'detached')
redis.call('PEXPIRE', KEYS[1], grace_ms)
count(KEYS[3], now + grace_ms, ARGV[1])
return 1
"""


class KeepDetachedArgs(NamedTuple):
    """KEEP_DETACHED's ARGV, in order (its KEYS: the session's :class:`SessionKeys`); the
    record's field/value pairs follow when the record is to be written back."""

    sid: str
    router: str
    remaining_ms: int  # of the resume grace


# The router that detached a session keeps its record for the resume grace: a record
# that Redis lost (a restart) is written back, detached, for the rest of the grace, so
# the client can still resume. Returns a Kept.
KEEP_DETACHED = _PRELUDE + """
local sid, remaining = ARGV[1], tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local h = redis.call('HMGET', KEYS[1], 'state', 'router', 'conn')
if h[1] then
  if h[1] ~= 'detached' or h[2] ~= ARGV[2] or h[3] ~= '' then return 0 end
  return 1
end
if #ARGV == 3 then return 3 end
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('HSET', KEYS[1], 'conn', '', 'state', 'detached')
redis.call('PEXPIRE', KEYS[1], remaining)
count(KEYS[3], now + remaining, sid)
return 1
"""


class ResumeArgs(NamedTuple):
    """RESUME's ARGV, in order. Its KEYS: the session's :class:`SessionKeys` for the pod
    its record names (read first: a session stays on its pod for life), then that pod's
    hash."""

    sid: str
    token_sha: str
    key_id: str
    conn: str
    hold_ms: int
    router: str
    pod: str


class ResumeReply(NamedTuple):
    """RESUME's reply: {'ok', address, pod_resume_token, pool, started_ms,
    earlier_samples, earlier_messages} | {denial}."""

    denial: Denial | None  # None: claimed
    address: str = ""
    pod_resume_token: str = ""
    pool: str = ""
    started_ms: int = 0
    earlier_samples: int = 0
    earlier_messages: int = 0

    @classmethod
    def decode(cls, reply: list[str]) -> ResumeReply:
        if reply[0] != "ok":
            return cls(Denial(reply[0]))
        return cls(None, reply[1], reply[2], reply[3], int(reply[4]), int(reply[5]),
                   int(reply[6]))


# Claim a session to resume it, in one step: the token, the key and the pod are checked
# and the record taken for this connection (the last claim wins, as on the pod).
RESUME = _PRELUDE + """
local h = redis.call('HMGET', KEYS[1], 'token_sha', 'pod', 'address', 'key_id',
  'pod_resume_token', 'pool', 'started_ms', 'earlier_samples', 'earlier_messages')
if not h[1] or h[1] ~= ARGV[2] or h[4] ~= ARGV[3] or not h[5] or h[5] == ''
    or h[2] ~= ARGV[7] then
  return {'bad_resume_token'}
end
if redis.call('EXISTS', KEYS[4]) == 0 then return {'pod_gone'} end
local hold_ms = tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'conn', ARGV[4], 'router', ARGV[6], 'state', 'resuming')
redis.call('PEXPIRE', KEYS[1], hold_ms)
count(KEYS[3], now + hold_ms, ARGV[1])
return {'ok', h[3], h[5], h[6], h[7], h[8] or '0', h[9] or '0'}
"""
