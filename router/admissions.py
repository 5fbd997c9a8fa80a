"""Admission and session records in Redis: every call is one atomic Lua script.

:class:`Admissions` is the router's whole view of shared state. It holds no state of
its own beyond the registered scripts; the streams a router holds are in
:class:`Session` objects owned by their handlers and listed in :class:`Sessions`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal, cast

import redis.asyncio as aioredis

from asrpool.router import scripts, settings, tokens

Reason = Literal[
    "busy", "unknown_pool", "key_limit", "queue_full", "key_queue_full", "bad_resume_token",
    "pod_gone",
]


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
    reason: Reason
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
        args = scripts.AdmitArgs(
            pool=request.pool,
            sid=request.token.session_id,
            key_id=request.key_id,
            key_limit=request.key_limit,
            policy=c.policy,
            hold_ms=c.hold_ms,
            exclude=",".join(exclude),
            ticket=ticket,
            ticket_lease_ms=max(2000, c.session_lease_ms),
            router=c.router_id,
            token_sha=request.token.sha256,
            conn=request.conn,
            pending_ms=c.pending_ms,
            queue_max=c.queue_max,
            queue_max_per_key=c.queue_max_per_key,
            members_required=int(c.members_required),
        )
        reply = scripts.AdmitReply.decode(await self._admit(args=args.argv()))
        if reply.outcome != "ok":
            # ADMIT answers 'ok' or one of the reasons (scripts.AdmitReply).
            return Refused(cast(Reason, reply.outcome), reply.rank)
        return Session(
            session_id=request.token.session_id,
            pool=request.pool,
            pod_id=reply.pod_id,
            address=reply.address,
            key_id=request.key_id,
            token_sha=request.token.sha256,
            conn=request.conn,
            router=c.router_id,
            started_ms=reply.now_ms,
        )

    async def leave_queue(self, request: Request, ticket: str, refused: bool = False) -> None:
        """Leave the wait queue; ``refused``: the client is told 'busy' (counted as demand)."""
        await self._leave(args=scripts.LeaveArgs(request.pool, ticket, request.key_id,
                                                 refused).argv())

    async def attach(self, session: Session) -> bool:
        """The pod accepted: record what it said (its own ids, for a resume)."""
        session.state = "attached"
        return bool(
            await self._attach(
                args=[
                    session.session_id,
                    session.conn,
                    self.config.hold_ms,
                    session.pod_resume_token,
                    session.pod_session_id,
                ]
            )
        )

    async def resume(self, request: Request) -> Session | Refused:
        """Claim a detached (or orphaned) session for this connection."""
        c = self.config
        reply = await self._resume(
            args=[
                request.token.session_id,
                request.token.sha256,
                request.key_id,
                request.conn,
                c.hold_ms,
                c.router_id,
            ]
        )
        if reply[0] == "bad_token":
            return Refused("bad_resume_token")
        if reply[0] == "pod_gone":
            return Refused("pod_gone")
        return Session(
            session_id=request.token.session_id,
            pool=reply[4],
            pod_id=reply[1],
            address=reply[2],
            key_id=request.key_id,
            token_sha=request.token.sha256,
            conn=request.conn,
            router=c.router_id,
            started_ms=int(reply[5]),
            pod_resume_token=reply[3],
            state="resuming",
        )

    async def release(self, session: Session) -> None:
        await self._release(args=[session.session_id, session.conn, session.pod_id,
                                  session.key_id, self.config.hold_ms])

    async def detach(self, session: Session) -> None:
        await self._detach(
            args=[session.session_id, session.conn, int(self.config.resume_grace_seconds * 1000)]
        )

    async def renew(self, sessions: Iterable[Session]) -> list[bool]:
        """Extend every lease in one round trip (a second one rebuilds the records that
        Redis lost: only then are their fields sent). Says, session by session, whether
        its pod's heartbeat is still there."""
        replies = await _rebuilding_lost(list(sessions), self._renew_all)
        return [reply != 2 for reply in replies]

    async def _renew_all(self, sessions: list[Session], whole: bool) -> list[Any]:
        hold_ms = self.config.hold_ms
        if not whole:  # the common case: one call for all of them
            return list(await self._renew_many(args=scripts.renew_many_argv(hold_ms, [
                scripts.RenewArgs(s.session_id, s.conn, s.pod_id, s.key_id) for s in sessions])))
        async with self.redis.pipeline(transaction=False) as pipe:
            for s in sessions:
                args: list[str | int] = [s.session_id, s.conn, hold_ms, s.pod_id, s.key_id,
                                         *s.fields()]
                await self._renew_whole(args=args, client=pipe)
            return list(await pipe.execute())

    async def keep_detached(self, held: list[Detached]) -> list[bool]:
        """Keep the records of sessions this router detached (rebuilding those Redis
        lost, for the rest of their grace); says which are still this router's to keep."""
        return [reply == 1 for reply in await _rebuilding_lost(held, self._keep_all)]

    async def _keep_all(self, held: list[Detached], whole: bool) -> list[Any]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for d in held:
                s = d.session
                args = scripts.KeepDetachedArgs(
                    s.session_id, s.router, d.remaining_ms, s.pod_id, s.key_id).argv()
                await self._keep_detached(args=[*args, *s.fields()] if whole else args,
                                          client=pipe)
            return list(await pipe.execute())


async def _rebuilding_lost(
    items: list[Any], run: Callable[[list[Any], bool], Awaitable[list[Any]]]
) -> list[Any]:
    """``run`` over ``items`` without their records, then again with the records for
    those whose record Redis had lost (reply 3)."""
    replies = await run(items, False)
    lost = [i for i, reply in enumerate(replies) if reply == 3]
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
