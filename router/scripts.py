"""The router's Lua scripts: every change to admission state is one atomic script.

Redis runs a script alone, so two routers racing for the last slot of a pod see each
other's reservations: the pod is never given more streams than it has slots. Time is
Redis's own (``TIME``), so routers on skewed clocks agree on lease deadlines. Keys are
built inside the scripts from the ``asrpool`` prefix (see :mod:`asrpool.router.keys`);
this ties the router to one Redis (or a primary with replicas), not a Redis Cluster.
"""

from __future__ import annotations

from typing import NamedTuple

from asrpool.common import waiting

_PRELUDE = """
local P = 'asrpool'
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
-- count a session against its pod and, when it has one, its API key
local function hold(pod, key_id, until_ms, sid)
  count(P .. ':pod:' .. pod .. ':sessions', until_ms, sid)
  if key_id ~= '' then count(P .. ':apikey:' .. key_id .. ':sessions', until_ms, sid) end
end
-- a request of the pool refused 'busy', for the operator's demand (common.waiting)
local function refused(pool, id)
  local key = P .. ':pool:' .. pool .. ':refused'
  redis.call('ZADD', key, now, id)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - REFUSALS_KEPT_MS)
  redis.call('PEXPIRE', key, REFUSALS_KEPT_MS)
end
""".replace("REFUSALS_KEPT_MS", str(waiting.REFUSALS_KEPT_MS))

# The load of one pod, mirroring policies.effective_used. Returns nil for a pod whose
# heartbeat hash has expired.
_LOAD = """
local function load(pod_id)
  local h = redis.call('HMGET', P .. ':pod:' .. pod_id,
    'total_slots', 'free_slots', 'draining', 'address')
  if not h[1] or not h[2] or not h[4] then return nil end
  local total = tonumber(h[1])
  local sessions = P .. ':pod:' .. pod_id .. ':sessions'
  redis.call('ZREMRANGEBYSCORE', sessions, '-inf', now)
  local used = math.max(total - tonumber(h[2]), redis.call('ZCARD', sessions))
  return {id = pod_id, address = h[4], total = total,
          free = math.max(0, total - used), draining = h[3] == '1'}
end
"""

class AdmitArgs(NamedTuple):
    """ADMIT's ARGV, in order (the Lua reads ARGV[1..16] by these positions)."""

    pool: str
    sid: str
    key_id: str
    key_limit: int
    policy: str
    hold_ms: int
    exclude: str  # comma separated pod ids
    ticket: str
    ticket_lease_ms: int
    router: str
    token_sha: str
    conn: str
    pending_ms: int  # how long a reservation counts before the pod has accepted it
    queue_max: int  # waiters a pool's queue holds at most (a new one beyond: queue_full)
    queue_max_per_key: int  # waiters of one API key at most (beyond: key_queue_full); 0: any
    members_required: int  # 1: a pool whose pods are not listed has none (0: any heartbeat)

    def argv(self) -> list[str | int]:
        return list(self)


class AdmitReply(NamedTuple):
    """ADMIT's reply: {'ok', pod_id, address, now_ms} | {'busy', rank} |
    {'unknown_pool'} | {'key_limit'} | {'queue_full'} | {'key_queue_full'}."""

    outcome: str
    pod_id: str = ""
    address: str = ""
    now_ms: int = 0
    rank: int | None = None

    @classmethod
    def decode(cls, reply: list[str]) -> AdmitReply:
        if reply[0] == "ok":
            return cls("ok", reply[1], reply[2], int(reply[3]))
        return cls(reply[0], rank=int(reply[1]) if len(reply) > 1 else None)


ADMIT = (
    _PRELUDE
    + _LOAD
    + """
local pool, sid, key_id = ARGV[1], ARGV[2], ARGV[3]
local key_limit, policy = tonumber(ARGV[4]), ARGV[5]
local hold_ms = tonumber(ARGV[6])
local exclude = {}
for id in string.gmatch(ARGV[7], '[^,]+') do exclude[id] = true end
local ticket, ticket_lease_ms = ARGV[8], tonumber(ARGV[9])

if redis.call('SISMEMBER', P .. ':pools', pool) == 0 then return {'unknown_pool'} end

local key_sessions = P .. ':apikey:' .. key_id .. ':sessions'
if key_id ~= '' then
  redis.call('ZREMRANGEBYSCORE', key_sessions, '-inf', now)
  if key_limit > 0 and redis.call('ZCARD', key_sessions) >= key_limit then
    return {'key_limit'}
  end
end

local pods_key = P .. ':pool:' .. pool .. ':pods'
redis.call('ZREMRANGEBYSCORE', pods_key, '-inf', now)
-- a heartbeat alone does not make a pod: once the pool's real pods are listed (by the
-- operator or the local platform), only a listed pod at its listed IP is admitted to
local members = P .. ':pool:' .. pool .. ':members'
local listed = redis.call('EXISTS', members) == 1
local members_required = ARGV[16] == '1'
local function real(pod)
  if not listed then return not members_required end
  local ip = redis.call('HGET', members, pod.id)
  return ip ~= false and ip ~= '' and string.match(pod.address, '^(.*):%d+$') == ip
end
local best = nil
local free_total = 0
for _, pod_id in ipairs(redis.call('ZRANGE', pods_key, 0, -1)) do
  local pod = load(pod_id)
  if pod and not pod.draining and pod.free > 0 and not exclude[pod.id] and real(pod) then
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

local queue = P .. ':pool:' .. pool .. ':queue'
local leases = queue .. ':leases'
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now)) do
  redis.call('ZREM', queue, gone)
  redis.call('ZREM', leases, gone)
end
local key_queue = queue .. ':key:' .. key_id
local rank
if ticket ~= '' then
  if not redis.call('ZSCORE', queue, ticket) then
    if redis.call('ZCARD', queue) >= tonumber(ARGV[14]) then return {'queue_full'} end
    if key_id ~= '' and tonumber(ARGV[15]) > 0 then
      redis.call('ZREMRANGEBYSCORE', key_queue, '-inf', now)
      if redis.call('ZCARD', key_queue) >= tonumber(ARGV[15]) then return {'key_queue_full'} end
    end
    redis.call('ZADD', queue, redis.call('INCR', queue .. ':seq'), ticket)
  end
  -- every poll keeps the queue and its counter alive: a queue (or counter) that expired
  -- under waiting tickets would number them again in the order of their next polls
  count(leases, now + ticket_lease_ms, ticket)
  keep(queue, ticket_lease_ms)
  keep(queue .. ':seq', ticket_lease_ms)
  if key_id ~= '' then count(key_queue, now + ticket_lease_ms, ticket) end
  rank = redis.call('ZRANK', queue, ticket)
else
  rank = redis.call('ZCARD', queue)
end
if best == nil or rank >= free_total then
  if ticket == '' then refused(pool, sid) end  -- a waiting client counts once it gives up
  return {'busy', tostring(rank)}
end
if ticket ~= '' then
  redis.call('ZREM', queue, ticket)
  redis.call('ZREM', leases, ticket)
  redis.call('ZREM', key_queue, ticket)
end

hold(best.id, key_id, now + tonumber(ARGV[13]), sid)
local skey = P .. ':session:' .. sid
redis.call('HSET', skey, 'session_id', sid, 'pool', pool, 'pod', best.id,
  'address', best.address, 'key_id', key_id, 'started_ms', now, 'router', ARGV[10],
  'token_sha', ARGV[11], 'conn', ARGV[12], 'state', 'reserved')
redis.call('PEXPIRE', skey, hold_ms)
return {'ok', best.id, best.address, tostring(now)}
"""
)

class LeaveArgs(NamedTuple):
    """LEAVE_QUEUE's ARGV, in order."""

    pool: str
    ticket: str
    key_id: str
    refused: bool = False  # the client is told 'busy': left for the operator as demand

    def argv(self) -> list[str | int]:
        return [self.pool, self.ticket, self.key_id, "1" if self.refused else "0"]


# Leave the wait queue (a waiter gave up, or its client left): at once, so that no
# one behind it waits for a ticket nobody will use.
LEAVE_QUEUE = _PRELUDE + """
local queue = P .. ':pool:' .. ARGV[1] .. ':queue'
redis.call('ZREM', queue, ARGV[2])
redis.call('ZREM', queue .. ':leases', ARGV[2])
redis.call('ZREM', queue .. ':key:' .. ARGV[3], ARGV[2])
if ARGV[4] == '1' then refused(ARGV[1], ARGV[2]) end
return 1
"""

# The pod accepted the stream: it now holds the slot, for its resume grace even if this
# router dies, so the session counts for the whole hold. ARGV: sid, conn, hold_ms,
# pod_resume_token, pod_session_id. Returns 0 when the session is no longer this
# connection's.
ATTACH = (
    _PRELUDE
    + """
local skey = P .. ':session:' .. ARGV[1]
if redis.call('HGET', skey, 'conn') ~= ARGV[2] then return 0 end
local h = redis.call('HMGET', skey, 'pod', 'key_id')
redis.call('HSET', skey, 'state', 'attached', 'pod_resume_token', ARGV[4],
  'pod_session_id', ARGV[5])
redis.call('PEXPIRE', skey, tonumber(ARGV[3]))
local until_ms = now + tonumber(ARGV[3])
hold(h[1], h[2], until_ms, ARGV[1])
return 1
"""
)

# Renew one session's lease: 0: claimed by another connection, or released (it stays
# so); 1: renewed; 2: renewed, but the pod's heartbeat has lapsed; 3: Redis lost the
# record (a restart) and ``fields`` (its field/value pairs) were not given: ask again
# with them. ``alive`` caches each pod's heartbeat over one script.
_RENEW_ONE = """
local function renew(sid, conn, hold_ms, pod, key_id, fields, alive)
  local skey = P .. ':session:' .. sid
  local owner = redis.call('HGET', skey, 'conn')
  if owner and owner ~= conn then return 0 end
  if redis.call('EXISTS', skey .. ':ended') == 1 then return 0 end
  if not owner then
    if not fields then return 3 end
    redis.call('HSET', skey, 'conn', conn, unpack(fields))
  end
  redis.call('PEXPIRE', skey, hold_ms)
  hold(pod, key_id, now + hold_ms, sid)
  if alive[pod] == nil then alive[pod] = redis.call('EXISTS', P .. ':pod:' .. pod) == 1 end
  if not alive[pod] then return 2 end
  return 1
end
"""


class RenewArgs(NamedTuple):
    """One session in RENEW_MANY's ARGV (after the hold), in order."""

    sid: str
    conn: str
    pod: str
    key_id: str


def renew_many_argv(hold_ms: int, sessions: list[RenewArgs]) -> list[str | int]:
    return [hold_ms, *(value for s in sessions for value in s)]


# Renew many sessions' leases in one call (a router renews all its sessions every
# third of a lease: one command per session cost the relay's loop more than the
# relaying). ARGV: hold_ms, then RenewArgs of each session. Returns each one's reply.
RENEW_MANY = _PRELUDE + _RENEW_ONE + """
local hold_ms, replies, alive = tonumber(ARGV[1]), {}, {}
for i = 2, #ARGV, 4 do
  replies[#replies + 1] = renew(ARGV[i], ARGV[i + 1], hold_ms, ARGV[i + 2], ARGV[i + 3], nil, alive)
end
return replies
"""

# Renew one session and write its record back (after RENEW_MANY answered 3). ARGV:
# sid, conn, hold_ms, pod, key_id, then the record's field/value pairs.
RENEW_WHOLE = _PRELUDE + _RENEW_ONE + """
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
return renew(ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], fields, {})
"""

# End a session for good. ARGV: sid, conn, pod, key_id, hold_ms. A record another
# connection has claimed (a resume through another router) is left alone. A tombstone
# (``...:ended``) outlives any lease the session had, so a renewal still in flight
# cannot write the record back (RENEW_WHOLE rebuilds only what a Redis restart lost).
RELEASE = _PRELUDE + """
local skey = P .. ':session:' .. ARGV[1]
local owner = redis.call('HGET', skey, 'conn')
if owner and owner ~= ARGV[2] then return 0 end
redis.call('DEL', skey)
redis.call('SET', skey .. ':ended', '1', 'PX', tonumber(ARGV[5]))
redis.call('ZREM', P .. ':pod:' .. ARGV[3] .. ':sessions', ARGV[1])
if ARGV[4] ~= '' then redis.call('ZREM', P .. ':apikey:' .. ARGV[4] .. ':sessions', ARGV[1]) end
return 1
"""

# The client went away but the pod keeps the slot for a resume: hold the record (and
# count the slot) for the grace period, owned by no connection. ARGV: sid, conn, grace_ms
DETACH = (
    _PRELUDE
    + """
local skey = P .. ':session:' .. ARGV[1]
local h = redis.call('HMGET', skey, 'conn', 'pod', 'key_id')
if h[1] ~= ARGV[2] then return 0 end
local until_ms = now + tonumber(ARGV[3])
redis.call('HSET', skey, 'conn', '', 'state', 'detached')
redis.call('PEXPIRE', skey, tonumber(ARGV[3]))
hold(h[2], h[3], until_ms, ARGV[1])
return 1
"""
)

class KeepDetachedArgs(NamedTuple):
    """KEEP_DETACHED's ARGV, in order; the record's field/value pairs follow when the
    record is to be written back."""

    sid: str
    router: str
    remaining_ms: int  # of the resume grace
    pod: str
    key_id: str

    def argv(self) -> list[str | int]:
        return list(self)


# The router that detached a session keeps its record for the resume grace: a record
# that Redis lost (a restart) is written back, detached, for the rest of the grace, so
# the client can still resume. Returns 1: kept; 0: resumed (claimed by a connection),
# released or claimed by another router: no longer this router's to keep; 3: lost,
# asked without the fields (send them).
KEEP_DETACHED = (
    _PRELUDE
    + """
local sid, remaining = ARGV[1], tonumber(ARGV[3])
local skey = P .. ':session:' .. sid
if redis.call('EXISTS', skey .. ':ended') == 1 then return 0 end
local h = redis.call('HMGET', skey, 'state', 'router', 'conn')
if h[1] then
  if h[1] ~= 'detached' or h[2] ~= ARGV[2] or h[3] ~= '' then return 0 end
  return 1
end
if #ARGV == 5 then return 3 end
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', skey, unpack(fields))
redis.call('HSET', skey, 'conn', '', 'state', 'detached')
redis.call('PEXPIRE', skey, remaining)
hold(ARGV[4], ARGV[5], now + remaining, sid)
return 1
"""
)


# Claim a session to resume it. ARGV: sid, token_sha, key_id, conn, hold_ms, router
# Returns {'ok', pod, address, pod_resume_token, pool, started_ms} | {'bad_token'} | {'pod_gone'}
RESUME = (
    _PRELUDE
    + """
local skey = P .. ':session:' .. ARGV[1]
local h = redis.call('HMGET', skey, 'token_sha', 'pod', 'address', 'key_id',
  'pod_resume_token', 'pool', 'started_ms')
if not h[1] or h[1] ~= ARGV[2] or h[4] ~= ARGV[3] or not h[5] or h[5] == '' then
  return {'bad_token'}
end
if redis.call('EXISTS', P .. ':pod:' .. h[2]) == 0 then return {'pod_gone'} end
local deadline = now + tonumber(ARGV[5])
redis.call('HSET', skey, 'conn', ARGV[4], 'router', ARGV[6], 'state', 'resuming')
redis.call('PEXPIRE', skey, tonumber(ARGV[5]))
hold(h[2], h[4], deadline, ARGV[1])
return {'ok', h[2], h[3], h[5], h[6], h[7]}
"""
)
