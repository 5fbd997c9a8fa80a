"""Churn: thousands of random connects, disconnects, client drops, resumes, router kills
and pod kills against a real Redis never over-admit a pod or an API key, and end with
every slot free once leases run out.

Pods are simulated (they are the registry's writers: heartbeats through
``registry.write_heartbeat``, slots held for a grace period after a drop, as the real
server does); routers are real :class:`Admissions` objects with their own clients.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import hypothesis
import redis.asyncio as aioredis
from hypothesis import strategies as st

from asrpool.common import registry
from asrpool.router import admissions, keys, tokens, views
from tests.router import support
from tests.support.redis_servers import RedisServer

LEASE_MS = 600
GRACE_S = 0.3
KEY_LIMITS = {"": 0, "k1": 3, "k2": 2}


@dataclasses.dataclass
class Held:
    session: admissions.Session
    token: tokens.ResumeToken
    router: int


@dataclasses.dataclass
class SimPod:
    """What a real pod does with its slots: a drop keeps the slot for the grace period."""

    pod_id: str
    total: int
    alive: bool = True
    attached: set[str] = dataclasses.field(default_factory=set)
    detached: dict[str, float] = dataclasses.field(default_factory=dict)  # sid -> expiry

    def used(self) -> int:
        now = time.monotonic()
        self.detached = {sid: t for sid, t in self.detached.items() if t > now}
        return len(self.attached) + len(self.detached)


class World:
    def __init__(self, url: str) -> None:
        self.url = url
        self.pods = {f"p{i}": SimPod(f"p{i}", total) for i, total in enumerate((2, 3, 4))}
        self.clients: list[aioredis.Redis] = []
        self.routers: list[admissions.Admissions | None] = []
        self.held: list[Held] = []
        self.dropped: list[Held] = []
        self.last_beat = self.last_renew = 0.0
        self.admitted = 0

    async def start(self) -> None:
        for _ in range(3):
            client = aioredis.Redis.from_url(self.url, decode_responses=True)
            self.clients.append(client)
            config = support.config(self.url, session_lease_ms=LEASE_MS,
                                    resume_grace_seconds=GRACE_S)
            self.routers.append(admissions.Admissions(client, config))
        await self.beat()

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()

    async def beat(self) -> None:
        for pod in self.pods.values():
            if pod.alive:
                free = pod.total - pod.used()
                await support.beat(self.clients[0], pod.pod_id, pod.total, free, lease_ms=5000)
        self.last_beat = time.monotonic()

    async def tick(self) -> None:
        """What runs in the background in real life: heartbeats and lease renewal."""
        now = time.monotonic()
        if now - self.last_beat > 0.05:
            await self.beat()
        if now - self.last_renew > LEASE_MS / 3000:
            for i, router in enumerate(self.routers):
                if router is not None:
                    await router.renew([h.session for h in self.held if h.router == i])
            self.last_renew = now

    def key_use(self, key_id: str) -> int:
        now = time.monotonic()
        live = [h for h in self.held if h.session.key_id == key_id]
        waiting = [
            h
            for h in self.dropped
            if h.session.key_id == key_id
            and self.pods[h.session.pod_id].detached.get(h.session.session_id, 0) > now
        ]
        return len(live) + len(waiting)

    async def connect(self, r: int, key_id: str) -> None:
        router = self.routers[r]
        if router is None:
            return
        token = tokens.mint("default", tokens.new_session_id())
        req = admissions.Request("default", key_id, KEY_LIMITS[key_id], token, token.session_id)
        got = await router.admit(req)
        if isinstance(got, admissions.Refused):
            return
        pod = self.pods[got.pod_id]
        assert pod.alive, "admitted onto a dead pod"
        assert pod.used() < pod.total, f"over-admitted {pod.pod_id}"
        if key_id:
            assert self.key_use(key_id) < KEY_LIMITS[key_id], f"key {key_id} over its limit"
        pod.attached.add(token.session_id)
        got.pod_resume_token = "t"
        await router.attach(got)
        self.held.append(Held(got, token, r))
        self.admitted += 1

    def _take(self, index: int) -> Held | None:
        return self.held.pop(index % len(self.held)) if self.held else None

    async def disconnect(self, index: int) -> None:
        held = self._take(index)
        if held is None:
            return
        self.pods[held.session.pod_id].attached.discard(held.session.session_id)
        router = self.routers[held.router]
        assert router is not None
        await router.release(held.session)

    async def drop(self, index: int) -> None:
        held = self._take(index)
        if held is None:
            return
        pod = self.pods[held.session.pod_id]
        pod.attached.discard(held.session.session_id)
        pod.detached[held.session.session_id] = time.monotonic() + GRACE_S
        router = self.routers[held.router]
        assert router is not None
        await router.detach(held.session)
        self.dropped.append(held)

    async def resume(self, index: int, r: int) -> None:
        router = self.routers[r]
        if not self.dropped or router is None:
            return
        held = self.dropped.pop(index % len(self.dropped))
        conn = tokens.new_session_id()
        req = admissions.Request("", held.session.key_id, 0, held.token, conn)
        got = await router.resume(req)
        if isinstance(got, admissions.Refused):
            return
        pod = self.pods[got.pod_id]
        if not pod.alive or pod.detached.pop(got.session_id, 0) <= time.monotonic():
            await router.release(got)  # the pod answers bad_resume_token
            return
        pod.attached.add(got.session_id)
        await router.attach(got)
        self.held.append(Held(got, held.token, r))

    async def kill_router(self, r: int) -> None:
        if self.routers[r] is None or sum(1 for x in self.routers if x) == 1:
            return
        self.routers[r] = None
        expiry = time.monotonic() + GRACE_S
        for held in [h for h in self.held if h.router == r]:
            pod = self.pods[held.session.pod_id]
            pod.attached.discard(held.session.session_id)
            pod.detached[held.session.session_id] = expiry
            self.held.remove(held)

    async def kill_pod(self, p: int) -> None:
        pod = self.pods[f"p{p}"]
        if not pod.alive:
            return
        pod.alive = False
        await registry.remove_pod(self.clients[0], pod.pod_id, "default")  # its lease ran out
        for held in [h for h in self.held if h.session.pod_id == pod.pod_id]:
            self.held.remove(held)
            router = self.routers[held.router]
            assert router is not None
            await router.release(held.session)  # the router saw the pod's socket die
        pod.attached.clear()
        pod.detached.clear()

    async def revive_pod(self, p: int) -> None:
        pod = self.pods[f"p{p}"]
        pod.alive = True
        await self.beat()

    async def revive_router(self, r: int) -> None:
        if self.routers[r] is None:
            config = support.config(self.url, session_lease_ms=LEASE_MS,
                                    resume_grace_seconds=GRACE_S)
            self.routers[r] = admissions.Admissions(self.clients[r], config)

    async def settle(self) -> None:
        """Every router dies; wait out leases and grace; every live slot is free again."""
        self.routers = [None] * len(self.routers)
        await asyncio.sleep((LEASE_MS / 1000 + GRACE_S) * 1.2)
        for pod in self.pods.values():
            pod.attached.clear()
        await self.beat()
        loads = {v.beat.pod_id: v.load for v in await views.read_pool(self.clients[0], "default")}
        live = {p.pod_id: p.total for p in self.pods.values() if p.alive}
        assert {pod_id: load.free for pod_id, load in loads.items()} == live
        redis = self.clients[0]
        assert await redis.keys(keys.session("*", "*")) == []
        # nothing is left behind either: every session zset has expired with its members
        assert await redis.keys(keys.pod_sessions("*", "*")) == []
        assert await redis.keys(keys.key_sessions("*")) == []
        for key_id in KEY_LIMITS:
            if key_id:
                assert (
                    await redis.zrangebyscore(keys.key_sessions(key_id), registry.now_ms(), "+inf")
                    == []
                )


# Names weighted by repetition; every op gets (index, router or pod number, key id).
NAMES = (
    ["connect"] * 8
    + ["disconnect"] * 3
    + ["drop"] * 2
    + ["resume"] * 2
    + [
        "kill_router",
        "revive_router",
        "kill_pod",
        "revive_pod",
    ]
)
ops = st.tuples(
    st.sampled_from(NAMES),
    st.integers(0, 50),
    st.integers(0, 2),
    st.sampled_from(sorted(KEY_LIMITS)),
)


async def run_op(world: World, name: str, index: int, number: int, key_id: str) -> None:
    if name == "connect":
        await world.connect(number, key_id)
    elif name in ("disconnect", "drop"):
        await getattr(world, name)(index)
    elif name == "resume":
        await world.resume(index, number)
    else:
        await getattr(world, name)(number)


async def play(url: str, program: list[tuple[str, int, int, str]]) -> int:
    world = World(url)
    await world.start()
    try:
        for name, index, number, key_id in program:
            await world.tick()
            await run_op(world, name, index, number, key_id)
        await world.settle()
        return world.admitted
    finally:
        await world.close()


@hypothesis.settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        hypothesis.HealthCheck.function_scoped_fixture,
        hypothesis.HealthCheck.too_slow,
    ],
)
@hypothesis.given(program=st.lists(ops, min_size=150, max_size=300))
def test_churn_never_over_admits_nor_leaks(
    redis_server: RedisServer, program: list[tuple[str, int, int, str]]
) -> None:
    asyncio.run(_flush(redis_server.url))
    admitted = asyncio.run(play(redis_server.url, program))
    hypothesis.event(f"admitted {admitted // 25 * 25}+")


async def _flush(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    await client.flushdb()
    await client.aclose()
