"""Admission and session records in Redis: every call is one atomic Lua script.

:class:`Admissions` is the router's whole view of shared state. It holds no state of
its own beyond the registered scripts; the streams a router holds are in
:class:`Session` objects owned by their handlers and listed in :class:`Sessions`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from asrpool.common import redis_clients, registry
from asrpool.router import keys, scripts, settings, tokens


@dataclasses.dataclass(frozen=True)
class Earlier:
    """What a stream had on the pods before its current one (``router.moving``): the
    samples its client had sent, and the messages (``Ready`` apart) it had been sent.
    A resume adds them to its pod's counts: the stream's clock and resume offset, and
    the messages it asks its pod to replay, are the stream's, not its pod's."""

    samples: int = 0
    messages: int = 0


@dataclasses.dataclass(frozen=True)
class Request:
    """What a client asks for: a stream in ``pool`` on behalf of API key ``key_id``."""

    pool: str
    key_id: str  # "" when the router runs without API keys
    key_limit: int  # 0: no limit
    token: tokens.ResumeToken
    conn: str  # this connection's id: only its owner may renew or end a session
    earlier: Earlier = Earlier()  # a moved stream's, recorded with its new pod


@dataclasses.dataclass
class Session:
    """One stream this router holds; the source of truth to rebuild Redis from."""

    session_id: str
    pool: str
    pod_id: str
    address: str
    key_id: str
    token_sha: str
    conn: str
    router: str
    started_ms: int = 0
    pod_resume_token: str = ""
    pod_session_id: str = ""
    state: str = "reserved"
    earlier: Earlier = Earlier()
    # Set by lease renewal when the pod's heartbeat has lapsed for good (a pod that
    # vanished without closing its sockets).
    pod_gone: asyncio.Event = dataclasses.field(default_factory=asyncio.Event, repr=False)
    missed_beats: int = 0

    def fields(self) -> list[str]:
        """The record's field/value pairs as Redis stores them (``conn`` apart)."""
        pairs = {
            "session_id": self.session_id,
            "pool": self.pool,
            "pod": self.pod_id,
            "address": self.address,
            "key_id": self.key_id,
            "started_ms": str(self.started_ms),
            "router": self.router,
            "token_sha": self.token_sha,
            "state": self.state,
            "pod_resume_token": self.pod_resume_token,
            "pod_session_id": self.pod_session_id,
            "earlier_samples": str(self.earlier.samples),
            "earlier_messages": str(self.earlier.messages),
        }
        return [item for pair in pairs.items() for item in pair]


@dataclasses.dataclass(frozen=True)
class Refused:
    reason: scripts.Denial
    rank: int | None = None  # place in the wait queue, for "busy"


class Admissions:
    def __init__(self, redis: aioredis.Redis, config: settings.RouterSettings) -> None:
        self.redis = redis
        self.config = config
        self._admit = redis.register_script(scripts.ADMIT)
        self._leave = redis.register_script(scripts.LEAVE_QUEUE)
        self._attach = redis.register_script(scripts.ATTACH)
        self._renew_many = redis.register_script(scripts.RENEW_MANY)
        self._renew_whole = redis.register_script(scripts.RENEW_WHOLE)
        self._release = redis.register_script(scripts.RELEASE)
        self._detach = redis.register_script(scripts.DETACH)
        self._resume = redis.register_script(scripts.RESUME)
        self._keep_detached = redis.register_script(scripts.KEEP_DETACHED)
        self._key_reserve = redis.register_script(scripts.KEY_RESERVE)
        self._key_hold = redis.register_script(scripts.KEY_HOLD)
        self._key_drop = redis.register_script(scripts.KEY_DROP)

    async def admit(
        self, request: Request, exclude: Iterable[str] = (), ticket: str = ""
    ) -> Session | Refused:
        """Reserve a slot on a pod of the request's pool, or say why not: the API key's
        count first (in its own slot), given back if no pod has room."""
        sid = request.token.session_id
        if request.key_id and not await self._key_reserve(
                keys=[keys.key_sessions(request.key_id)],
                args=scripts.KeyArgs(sid, request.key_limit, self.config.pending_ms)):
            return Refused(scripts.Denial.KEY_LIMIT)
        got = await self._admit_in_pool(request, exclude, ticket)
        if isinstance(got, Refused):
            await self._drop_keys([(request.key_id, sid)])
        return got

    async def _admit_in_pool(
        self, request: Request, exclude: Iterable[str], ticket: str
    ) -> Session | Refused:
        c = self.config
        sid = request.token.session_id
        pods = await self._candidates(request.pool, set(exclude))
        args = scripts.AdmitArgs(
            sid=sid,
            key_id=request.key_id,
            policy=c.policy,
            hold_ms=c.hold_ms,
            ticket=ticket,
            ticket_lease_ms=max(2000, c.session_lease_ms),
            router=c.router_id,
            token_sha=request.token.sha256,
            conn=request.conn,
            pending_ms=c.pending_ms,
            queue_max=c.queue_max,
            queue_max_per_key=c.queue_max_per_key,
            members_required=int(c.members_required),
            pool=request.pool,
        )
        admit_keys = scripts.AdmitKeys.of(request.pool, sid, request.key_id)
        reply = scripts.AdmitReply.decode(
            await self._admit(keys=admit_keys.with_pods(request.pool, pods),
                              args=args.with_pods(pods)))
        if reply.denial is not None:
            return Refused(reply.denial, reply.rank)
        return Session(
            session_id=sid,
            pool=request.pool,
            pod_id=reply.pod_id,
            address=reply.address,
            key_id=request.key_id,
            token_sha=request.token.sha256,
            conn=request.conn,
            router=c.router_id,
            started_ms=reply.now_ms,
            earlier=request.earlier,
        )

    async def _candidates(self, pool: str, exclude: set[str]) -> list[str]:
        """The pool's pods as last listed (ADMIT checks each one's lease itself)."""
        listed = await registry.listed_pods(self.redis, pool)
        return [pod_id for pod_id in listed if pod_id not in exclude]

    async def leave_queue(self, request: Request, ticket: str, refused: bool = False) -> None:
        """Leave the wait queue; ``refused``: the client is told 'busy' (counted as demand)."""
        await self._leave(keys=scripts.LeaveKeys.of(request.pool, request.key_id),
                          args=scripts.LeaveArgs(ticket, int(refused)))

    async def attach(self, session: Session) -> bool:
        """The pod accepted: record what it said (its own ids, for a resume)."""
        session.state = "attached"
        args = scripts.AttachArgs(session.session_id, session.conn, self.config.hold_ms,
                                  session.pod_resume_token, session.pod_session_id,
                                  session.earlier.samples, session.earlier.messages)
        attached = bool(await self._attach(keys=_keys(session), args=args))
        if attached:
            await self._hold_keys([session], self.config.hold_ms)
        return attached

    async def resume(self, request: Request) -> Session | Refused:
        """Claim a detached (or orphaned) session for this connection (its token names
        the pool, whose slot holds the record)."""
        c = self.config
        sid, pool = request.token.session_id, request.token.pool
        recorded = await self.redis.hget(keys.session(pool, sid), "pod")
        if recorded is None:
            return Refused(scripts.Denial.BAD_RESUME_TOKEN)
        pod_id = registry.as_text(recorded)
        # A session its key no longer counts (its router died, its hold lapsed) counts
        # again only within the key's max_streams: resumes must not open a way past it.
        if request.key_id and not await self._key_reserve(
                keys=[keys.key_sessions(request.key_id)],
                args=scripts.KeyArgs(sid, request.key_limit, c.hold_ms)):
            return Refused(scripts.Denial.KEY_LIMIT)
        args = scripts.ResumeArgs(sid, request.token.sha256, request.key_id, request.conn,
                                  c.hold_ms, c.router_id, pod_id)
        reply = scripts.ResumeReply.decode(await self._resume(
            keys=scripts.session_and_pod_keys(pool, sid, pod_id), args=args))
        if reply.denial is not None:
            return Refused(reply.denial)
        await self._hold_keys([(request.key_id, sid)], c.hold_ms)
        return Session(
            session_id=sid,
            pool=reply.pool,
            pod_id=pod_id,
            address=reply.address,
            key_id=request.key_id,
            token_sha=request.token.sha256,
            conn=request.conn,
            router=c.router_id,
            started_ms=reply.started_ms,
            pod_resume_token=reply.pod_resume_token,
            state="resuming",
            earlier=Earlier(reply.earlier_samples, reply.earlier_messages),
        )

    async def release(self, session: Session) -> None:
        args = scripts.ReleaseArgs(session.session_id, session.conn, self.config.hold_ms)
        if await self._release(keys=_keys(session), args=args):
            await self._drop_keys([session])

    async def detach(self, session: Session) -> None:
        grace_ms = int(self.config.resume_grace_seconds * 1000)
        args = scripts.DetachArgs(session.session_id, session.conn, grace_ms)
        if await self._detach(keys=_keys(session), args=args):
            await self._hold_keys([session], grace_ms)

    async def renew(self, sessions: Iterable[Session]) -> list[bool]:
        """Extend every lease in one round trip (a second one rebuilds the records that
        Redis lost: only then are their fields sent). Says, session by session, whether
        its pod's heartbeat is still there."""
        replies = await _rebuilding_lost(list(sessions), self._renew_all)
        return [reply != scripts.Renewed.POD_SILENT for reply in replies]

    async def _renew_all(self, sessions: list[Session], whole: bool) -> list[int]:
        hold_ms = self.config.hold_ms
        replies = await (self._renew_records if whole else self._renew_by_pool)(sessions)
        kept = (scripts.Renewed.RENEWED, scripts.Renewed.POD_SILENT)
        await self._hold_keys([s for s, r in zip(sessions, replies, strict=True) if r in kept],
                              hold_ms)
        return replies

    async def _renew_by_pool(self, sessions: list[Session]) -> list[int]:
        """The common case: one RENEW_MANY per pool (a slot each), in one round trip."""
        by_pool: dict[str, list[int]] = collections.defaultdict(list)
        for i, s in enumerate(sessions):
            by_pool[s.pool].append(i)
        results = await _run_scripts(self.redis, [
            (self._renew_many, *scripts.renew_many(self.config.hold_ms,
                                                   [_renewal(sessions[i]) for i in indices]))
            for indices in by_pool.values()])
        replies = [0] * len(sessions)
        for indices, result in zip(by_pool.values(), results, strict=True):
            for i, reply in zip(indices, result, strict=True):
                replies[i] = int(reply)
        return replies

    async def _renew_records(self, sessions: list[Session]) -> list[int]:
        """Renew and write back the records Redis lost, one RENEW_WHOLE each."""
        results = await _run_scripts(self.redis, [
            (self._renew_whole, *scripts.renew_whole(self.config.hold_ms, _renewal(s), s.fields()))
            for s in sessions])
        return [int(r) for r in results]

    async def _hold_keys(self, sessions: Sequence[Session | tuple[str, str]], ms: int) -> None:
        """Count these sessions against their API keys for ``ms`` more: one KEY_HOLD per
        key (a slot each), in one round trip; none for sessions without a key."""
        await self._per_key(sessions, lambda sids: [ms, *sids], self._key_hold)

    async def _drop_keys(self, sessions: Sequence[Session | tuple[str, str]]) -> None:
        await self._per_key(sessions, list, self._key_drop)

    async def _per_key(self, sessions: Sequence[Session | tuple[str, str]],
                       argv: Callable[[list[str]], scripts.Argv], script: AsyncScript) -> None:
        by_key: dict[str, list[str]] = collections.defaultdict(list)
        for s in sessions:
            key_id, sid = (s.key_id, s.session_id) if isinstance(s, Session) else s
            if key_id:
                by_key[key_id].append(sid)
        await _run_scripts(self.redis, [(script, [keys.key_sessions(key_id)], argv(sids))
                                        for key_id, sids in by_key.items()])

    async def keep_detached(self, held: list[Detached]) -> list[bool]:
        """Keep the records of sessions this router detached (rebuilding those Redis
        lost, for the rest of their grace); says which are still this router's to keep."""
        replies = await _rebuilding_lost(held, self._keep_all)
        return [reply == scripts.Kept.KEPT for reply in replies]

    async def _keep_all(self, held: list[Detached], whole: bool) -> list[int]:
        calls: list[ScriptCall] = []
        for d in held:
            s = d.session
            args = scripts.KeepDetachedArgs(s.session_id, s.router, d.remaining_ms)
            calls.append((self._keep_detached, _keys(s), [*args, *s.fields()] if whole else args))
        replies = [int(r) for r in await _run_scripts(self.redis, calls)]
        if whole:  # the records written back count against their keys again, in one trip
            await _run_scripts(self.redis, [
                (self._key_hold, [keys.key_sessions(d.session.key_id)],
                 [d.remaining_ms, d.session.session_id])
                for d, reply in zip(held, replies, strict=True)
                if reply == scripts.Kept.KEPT and d.session.key_id])
        return replies


ScriptCall = tuple[AsyncScript, Sequence[str], Sequence[str | int]]
# Well under the cluster client's 100 connections per node, each call holding one.
CLUSTER_CALLS_AT_ONCE = 32


async def _run_scripts(redis: aioredis.Redis, calls: Sequence[ScriptCall]) -> list[Any]:
    """Script calls in one round trip on one Redis (a pipeline); on a Redis Cluster, whose
    pipelines take no script (redis-py refuses EVALSHA there), side by side, each sent to
    the node of its slot, :data:`CLUSTER_CALLS_AT_ONCE` at a time."""
    if not calls:
        return []
    if redis_clients.is_cluster(redis):
        replies: list[Any] = []
        for i in range(0, len(calls), CLUSTER_CALLS_AT_ONCE):
            replies += await asyncio.gather(*(run(keys=k, args=a) for run, k, a
                                              in calls[i:i + CLUSTER_CALLS_AT_ONCE]))
        return replies
    async with redis.pipeline(transaction=False) as pipe:
        for run, k, a in calls:
            await run(keys=k, args=a, client=pipe)
        return list(await pipe.execute())


def _keys(session: Session) -> scripts.SessionKeys:
    return scripts.SessionKeys.of(session.pool, session.session_id, session.pod_id)


def _renewal(session: Session) -> scripts.RenewArgs:
    return scripts.RenewArgs(session.session_id, session.conn, session.pool, session.pod_id)


async def _rebuilding_lost(
    items: list[Any], run: Callable[[list[Any], bool], Awaitable[list[int]]]
) -> list[int]:
    """``run`` over ``items`` without their records, then again with the records for
    those whose record Redis had lost (Renewed.LOST, Kept.LOST)."""
    replies = await run(items, False)
    lost = [i for i, reply in enumerate(replies) if reply == scripts.Renewed.LOST]
    if lost:
        for i, reply in zip(lost, await run([items[i] for i in lost], True), strict=True):
            replies[i] = reply
    return replies


@dataclasses.dataclass(frozen=True)
class Detached:
    """A session this router detached, kept for the rest of its resume grace."""

    session: Session
    remaining_ms: int


class Sessions:
    """The sessions this router holds, renewed together by :func:`leasing.renew_forever`,
    and those it detached, kept until their resume grace ends (monotonic deadlines)."""

    def __init__(self) -> None:
        self._open: dict[str, Session] = {}
        self._detached: dict[str, tuple[Session, float]] = {}

    def hold_detached(self, session: Session, until: float) -> None:
        self._detached[session.session_id] = (session, until)

    def drop_detached(self, session: Session) -> None:
        self._detached.pop(session.session_id, None)

    def detached(self, now: float) -> list[Detached]:
        """The detached sessions whose grace has not ended at ``now`` (the rest are
        forgotten)."""
        for sid in [sid for sid, (_, until) in self._detached.items() if until <= now]:
            del self._detached[sid]
        return [Detached(s, int((until - now) * 1000)) for s, until in self._detached.values()]

    def add(self, session: Session) -> None:
        self._open[session.conn] = session

    def discard(self, session: Session) -> None:
        self._open.pop(session.conn, None)

    def __len__(self) -> int:
        return len(self._open)

    def snapshot(self) -> list[Session]:
        return list(self._open.values())
