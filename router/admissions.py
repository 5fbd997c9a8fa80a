"""Admission and session records in Redis: every call is one atomic Lua script.

:class:`Admissions` is the router's whole view of shared state. It holds no state of
its own beyond the registered scripts; the streams a router holds are in
:class:`Session` objects owned by their handlers and listed in :class:`Sessions`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import redis.asyncio as aioredis

from asrpool.common import registry
from asrpool.router import keys, scripts, settings, tokens


@dataclasses.dataclass(frozen=True)
class Request:
    """What a client asks for: a stream in ``pool`` on behalf of API key ``key_id``."""

    pool: str
    key_id: str  # "" when the router runs without API keys
    key_limit: int  # 0: no limit
    token: tokens.ResumeToken
    conn: str  # this connection's id: only its owner may renew or end a session


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

    async def admit(
        self, request: Request, exclude: Iterable[str] = (), ticket: str = ""
    ) -> Session | Refused:
        """Reserve a slot on a pod of the request's pool, or say why not."""
        c = self.config
        sid = request.token.session_id
        pods = await self._candidates(request.pool, set(exclude))
        args = scripts.AdmitArgs(
            sid=sid,
            key_id=request.key_id,
            key_limit=request.key_limit,
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
                                  session.key_id, session.pod_resume_token,
                                  session.pod_session_id)
        return bool(await self._attach(keys=_keys(session), args=args))

    async def resume(self, request: Request) -> Session | Refused:
        """Claim a detached (or orphaned) session for this connection."""
        c = self.config
        sid = request.token.session_id
        pod, pool = await self.redis.hmget(keys.session(sid), ["pod", "pool"])
        if pod is None or pool is None:
            return Refused(scripts.Denial.BAD_RESUME_TOKEN)
        pod_id, pool = registry.as_text(pod), registry.as_text(pool)
        args = scripts.ResumeArgs(sid, request.token.sha256, request.key_id, request.conn,
                                  c.hold_ms, c.router_id, pod_id)
        reply = scripts.ResumeReply.decode(await self._resume(
            keys=scripts.session_and_pod_keys(pool, sid, pod_id, request.key_id), args=args))
        if reply.denial is not None:
            return Refused(reply.denial)
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
        )

    async def release(self, session: Session) -> None:
        args = scripts.ReleaseArgs(session.session_id, session.conn, session.key_id,
                                   self.config.hold_ms)
        await self._release(keys=_keys(session), args=args)

    async def detach(self, session: Session) -> None:
        args = scripts.DetachArgs(session.session_id, session.conn,
                                  int(self.config.resume_grace_seconds * 1000), session.key_id)
        await self._detach(keys=_keys(session), args=args)

    async def renew(self, sessions: Iterable[Session]) -> list[bool]:
        """Extend every lease in one round trip (a second one rebuilds the records that
        Redis lost: only then are their fields sent). Says, session by session, whether
        its pod's heartbeat is still there."""
        replies = await _rebuilding_lost(list(sessions), self._renew_all)
        return [reply != scripts.Renewed.POD_SILENT for reply in replies]

    async def _renew_all(self, sessions: list[Session], whole: bool) -> list[int]:
        hold_ms = self.config.hold_ms
        renewed = [scripts.RenewArgs(s.session_id, s.conn, s.pool, s.pod_id, s.key_id)
                   for s in sessions]
        if not whole:  # the common case: one call for all of them
            many_keys, many_args = scripts.renew_many(hold_ms, renewed)
            return [int(r) for r in await self._renew_many(keys=many_keys, args=many_args)]
        async with self.redis.pipeline(transaction=False) as pipe:
            for s, one in zip(sessions, renewed, strict=True):
                one_keys, one_args = scripts.renew_whole(hold_ms, one, s.fields())
                await self._renew_whole(keys=one_keys, args=one_args, client=pipe)
            return [int(r) for r in await pipe.execute()]

    async def keep_detached(self, held: list[Detached]) -> list[bool]:
        """Keep the records of sessions this router detached (rebuilding those Redis
        lost, for the rest of their grace); says which are still this router's to keep."""
        replies = await _rebuilding_lost(held, self._keep_all)
        return [reply == scripts.Kept.KEPT for reply in replies]

    async def _keep_all(self, held: list[Detached], whole: bool) -> list[int]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for d in held:
                s = d.session
                args = scripts.KeepDetachedArgs(s.session_id, s.router, d.remaining_ms, s.key_id)
                await self._keep_detached(keys=_keys(s),
                                          args=[*args, *s.fields()] if whole else args,
                                          client=pipe)
            return [int(r) for r in await pipe.execute()]


def _keys(session: Session) -> scripts.SessionKeys:
    return scripts.SessionKeys.of(session.pool, session.session_id, session.pod_id,
                                  session.key_id)


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
