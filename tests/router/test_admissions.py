"""Admission, leases, key limits, queueing and resume records, against a real Redis."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from asrpool.common import registry, waiting
from asrpool.router import admissions, keys, leasing, tokens, views, wiring
from tests.router import support
from tests.support.redis_servers import RedisServer


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


def store(redis: aioredis.Redis, url: str, **overrides: Any) -> admissions.Admissions:
    return admissions.Admissions(redis, support.config(url, **overrides))


def request(
    pool: str = "default", key_id: str = "", limit: int = 0, conn: str = ""
) -> admissions.Request:
    token = tokens.mint(pool, tokens.new_session_id())
    return admissions.Request(pool, key_id, limit, token, conn or token.session_id)


async def free_of(redis: aioredis.Redis, pool: str = "default") -> dict[str, int]:
    return {p.beat.pod_id: p.load.free for p in await views.read_pool(redis, pool)}


async def held_for_resume(s: admissions.Admissions,
                   key_id: str = "team") -> tuple[admissions.Request, admissions.Session]:
    """A session admitted, attached (the pod gave a resume token) and detached."""
    req = request(key_id=key_id)
    held = await s.admit(req)
    assert isinstance(held, admissions.Session)
    held.pod_resume_token = "pod-token"
    await s.attach(held)
    await s.detach(held)
    return req, held


async def test_racing_routers_never_over_admit(redis_server: RedisServer) -> None:
    """4 routers (own clients), 3 pods of 4 slots, 40 admissions at once: exactly 12."""
    clients = [aioredis.Redis.from_url(redis_server.url, decode_responses=True) for _ in range(4)]
    for i in range(3):
        await support.beat(clients[0], f"pod-{i}", total=4)
    stores = [store(c, redis_server.url) for c in clients]
    results = await asyncio.gather(*(stores[i % 4].admit(request()) for i in range(40)))
    admitted = [r for r in results if isinstance(r, admissions.Session)]
    assert len(admitted) == 12
    assert collections.Counter(s.pod_id for s in admitted) == {"pod-0": 4, "pod-1": 4, "pod-2": 4}
    assert {r.reason for r in results if isinstance(r, admissions.Refused)} == {"busy"}
    for c in clients:
        await c.aclose()


async def test_the_pods_own_count_is_a_floor(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    """Streams the pod reports that no router holds (Redis lost them) still count."""
    await support.beat(redis, "a", total=4, free=0)
    s = store(redis, redis_server.url)
    assert await s.admit(request()) == admissions.Refused("busy", 0)
    await support.beat(redis, "a", total=4, free=3)
    assert isinstance(await s.admit(request()), admissions.Session)
    assert await free_of(redis) == {"a": 3}


async def test_a_reservation_counts_from_the_start_and_only_once(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    await support.beat(redis, "a", total=2)
    s = store(redis, redis_server.url)
    first = await s.admit(request())
    assert isinstance(first, admissions.Session)
    assert await free_of(redis) == {"a": 1}  # before the pod has even accepted it
    await s.attach(first)
    await support.beat(redis, "a", total=2, free=1)  # the pod now reports it
    assert await free_of(redis) == {"a": 1}  # counted once, not twice
    await s.release(first)
    assert await free_of(redis) == {"a": 1}  # the pod's stale report still holds it
    await support.beat(redis, "a", total=2, free=2)
    assert await free_of(redis) == {"a": 2}


async def test_draining_and_dead_pods_get_nothing(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    await support.beat(redis, "draining", total=4, draining=True)
    await support.beat(redis, "dying", total=4, lease_ms=100)
    await asyncio.sleep(0.2)
    got = await store(redis, redis_server.url).admit(request())
    assert got == admissions.Refused("busy", 0)


async def test_an_overloaded_pod_gets_no_new_stream_until_it_catches_up(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    """A pod behind real time says so in its heartbeat, free slots and all: no router
    admits to it, as to a draining pod, and the pool is full for the waiting room."""
    await support.beat(redis, "behind", total=4, free=4, overloaded=True)
    admit = store(redis, redis_server.url)
    assert await admit.admit(request()) == admissions.Refused("busy", 0)
    await support.beat(redis, "behind", total=4, free=4)  # caught up
    assert isinstance(await admit.admit(request()), admissions.Session)


async def test_unknown_pool(redis: aioredis.Redis, redis_server: RedisServer) -> None:
    await support.beat(redis, "a")
    got = await store(redis, redis_server.url).admit(request(pool="nope"))
    assert got == admissions.Refused("unknown_pool")


async def test_key_limit_counts_the_keys_streams_on_every_router(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    await support.beat(redis, "a", total=8)
    one, two = store(redis, redis_server.url), store(redis, redis_server.url)
    assert isinstance(await one.admit(request(key_id="team", limit=2)), admissions.Session)
    held = await two.admit(request(key_id="team", limit=2))
    assert isinstance(held, admissions.Session)
    assert await one.admit(request(key_id="team", limit=2)) == admissions.Refused("key_limit")
    assert isinstance(await one.admit(request(key_id="other", limit=2)), admissions.Session)
    await two.release(held)
    assert isinstance(await one.admit(request(key_id="team", limit=2)), admissions.Session)


async def test_a_crashed_routers_slots_come_back_after_lease_and_grace(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    """As long as the pod may hold them for a resume, then no longer."""
    await support.beat(redis, "a", total=2)
    crashed = store(redis, redis_server.url, session_lease_ms=300, resume_grace_seconds=0.3)
    for _ in range(2):
        got = await crashed.admit(request(key_id="k", limit=2))
        assert isinstance(got, admissions.Session)
        await crashed.attach(got)
    assert await free_of(redis) == {"a": 0}
    # the router dies: nobody renews; the pod (reporting no use) frees nothing itself
    await support.async_wait_until(lambda: _free_is(redis, {"a": 2}), 5, "leases to expire")
    assert isinstance(await crashed.admit(request(key_id="k", limit=2)), admissions.Session)


async def _free_is(redis: aioredis.Redis, want: dict[str, int]) -> bool:
    return await free_of(redis) == want


async def test_renewal_keeps_sessions_and_rebuilds_them_after_redis_restarts(
    redis_server: RedisServer,
) -> None:
    redis = wiring.connect_redis(support.config(redis_server.url))  # the router's own client
    await support.beat(redis, "a", total=2)
    s = store(redis, redis_server.url, session_lease_ms=300)
    held = await s.admit(request())
    assert isinstance(held, admissions.Session)
    await s.attach(held)
    for _ in range(4):
        await asyncio.sleep(0.1)
        await s.renew([held])
    assert await redis.zscore(keys.pod_sessions("default", "a"), held.session_id)
    redis_server.kill()
    redis_server.start()
    await support.async_wait_until(lambda: renewed(s, held), 5, "renewal after the restart")
    record = await redis.hgetall(keys.session("default", held.session_id))
    assert record["pod"] == "a" and record["state"] == "attached"
    assert await redis.zscore(keys.pod_sessions("default", "a"), held.session_id)
    await redis.aclose()


async def test_one_renewal_call_answers_each_session_for_itself(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    """All of a router's sessions are renewed in one script call; each gets its own
    answer: a live pod's session renewed, a lapsed pod's reported, a released one not
    brought back, and Redis losing one record asks for that record alone."""
    await support.beat(redis, "live", total=3)
    await support.beat(redis, "lapsing", total=1, lease_ms=200)
    s = store(redis, redis_server.url)
    held = [await s.admit(request()) for _ in range(4)]
    assert all(isinstance(h, admissions.Session) for h in held)
    sessions = [h for h in held if isinstance(h, admissions.Session)]
    for h in sessions:
        await s.attach(h)
    on_lapsing = next(h for h in sessions if h.pod_id == "lapsing")
    live = [h for h in sessions if h.pod_id == "live"]
    await s.release(live[0])
    await redis.delete(keys.session("default", live[1].session_id))  # as a restart loses it
    await support.async_wait_until(
        lambda: _gone(redis, "lapsing"), 5, "the lapsing pod's heartbeat to expire")
    alive = dict(zip((h.session_id for h in sessions), await s.renew(sessions), strict=True))
    assert alive[on_lapsing.session_id] is False
    assert alive[live[2].session_id] is True
    assert not await redis.exists(keys.session("default", live[0].session_id))  # released stays so
    rebuilt = await redis.hgetall(keys.session("default", live[1].session_id))
    assert rebuilt["pod"] == "live" and rebuilt["conn"] == live[1].conn


async def _gone(redis: aioredis.Redis, pod: str) -> bool:
    return not await redis.exists(registry.pod_key("default", pod))


async def renewed(s: admissions.Admissions, held: admissions.Session) -> bool:
    """One period of the renewal loop: a stale connection fails once, then reconnects."""
    try:
        await s.renew([held])
    except redis_errors.ConnectionError:
        return False
    return True


async def test_release_and_renew_leave_a_session_claimed_elsewhere_alone(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    await support.beat(redis, "a", total=2)
    old = store(redis, redis_server.url)
    req = request()
    held = await old.admit(req)
    assert isinstance(held, admissions.Session)
    held.pod_resume_token = "pod-token"
    await old.attach(held)
    resumed = await old.resume(admissions.Request("", "", 0, req.token, "new-conn"))
    assert isinstance(resumed, admissions.Session) and resumed.pod_id == "a"
    await old.release(held)  # the old connection ends late: must not end the resumed session
    await old.renew([held])
    assert await redis.hget(keys.session("default", held.session_id), "conn") == "new-conn"


async def test_resumes_racing_through_many_routers_leave_one_owner(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    """Each claim checks and takes the record in one script: six routers (own clients)
    resuming one session at once leave it with one connection, which no other's late
    release or renewal disturbs, and the pod's slot counted once."""
    await support.beat(redis, "a", total=2)
    s = store(redis, redis_server.url)
    req, held = await held_for_resume(s)
    clients = [aioredis.Redis.from_url(redis_server.url, decode_responses=True) for _ in range(6)]
    routers = [store(c, redis_server.url) for c in clients]
    claims = await asyncio.gather(*(r.resume(admissions.Request("", "team", 0, req.token, f"c{i}"))
                                    for i, r in enumerate(routers)))
    resumed = [c for c in claims if isinstance(c, admissions.Session)]
    assert len(resumed) == 6  # the last claim wins, as on the pod
    owner = await redis.hget(keys.session("default", held.session_id), "conn")
    losers = [(r, c) for r, c in zip(routers, resumed, strict=True) if c.conn != owner]
    assert len(losers) == 5
    for router, lost in losers:
        await router.renew([lost])
        await router.release(lost)
    assert await redis.hget(keys.session("default", held.session_id), "conn") == owner
    assert await redis.zcard(keys.pod_sessions("default", "a")) == 1
    assert await free_of(redis) == {"a": 1}
    for c in clients:
        await c.aclose()


async def test_resume_needs_the_token_the_key_and_a_live_pod(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    await support.beat(redis, "a", total=2)
    s = store(redis, redis_server.url)
    req, _ = await held_for_resume(s)
    forged = tokens.ResumeToken(req.token.pool, req.token.session_id, req.token.text + "x")
    assert await s.resume(admissions.Request("", "team", 0, forged, "c2")) == admissions.Refused(
        "bad_resume_token"
    )
    assert await s.resume(
        admissions.Request("", "other", 0, req.token, "c2")
    ) == admissions.Refused("bad_resume_token")
    await redis.delete(registry.pod_key("default", "a"))
    assert await s.resume(admissions.Request("", "team", 0, req.token, "c2")) == admissions.Refused(
        "pod_gone"
    )


async def test_a_resume_counts_against_its_keys_max_streams_again(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    """A held session its key no longer counts (its router died and its hold lapsed)
    resumes only within the key's max_streams: a key of one stream that opened another
    meanwhile is refused (it was let through: two streams on a key of one)."""
    await support.beat(redis, "a", total=4)
    s = store(redis, redis_server.url)
    req, held = await held_for_resume(s)
    await redis.zrem(keys.key_sessions("team"), held.session_id)  # the hold lapsed
    other = await s.admit(request(key_id="team", limit=1))
    assert isinstance(other, admissions.Session)
    resume = admissions.Request("", "team", 1, req.token, "c2")
    assert await s.resume(resume) == admissions.Refused("key_limit")
    await s.release(other)
    assert isinstance(await s.resume(resume), admissions.Session)  # within the limit
    assert await redis.zcard(keys.key_sessions("team")) == 1


async def test_a_detached_session_holds_its_slot_for_the_grace_period(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    await support.beat(redis, "a", total=1)
    s = store(redis, redis_server.url, resume_grace_seconds=0.4)
    held = await s.admit(request())
    assert isinstance(held, admissions.Session)
    await s.attach(held)
    await s.detach(held)
    assert await s.admit(request()) == admissions.Refused("busy", 0)
    await support.async_wait_until(lambda: _free_is(redis, {"a": 1}), 5, "grace to end")
    assert await redis.exists(keys.session("default", held.session_id)) == 0


async def test_waiters_are_served_first_come_first_served(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    await support.beat(redis, "a", total=1)
    s = store(redis, redis_server.url)
    holder = await s.admit(request())
    assert isinstance(holder, admissions.Session)
    assert await s.admit(request(), ticket="first") == admissions.Refused("busy", 0)
    assert await s.admit(request(), ticket="second") == admissions.Refused("busy", 1)
    await s.release(holder)
    assert await s.admit(request(), ticket="second") == admissions.Refused("busy", 1)
    assert await s.admit(request()) == admissions.Refused("busy", 2)  # no jumping the queue
    assert isinstance(await s.admit(request(), ticket="first"), admissions.Session)
    assert await redis.zrange(keys.pool_queue("default"), 0, -1) == ["second"]
    await s.leave_queue(request(), "second")
    assert await redis.zcard(keys.pool_queue("default")) == 0


async def test_busy_refusals_and_waiters_are_left_for_the_operator(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    """What the operator reads as unmet demand: a refusal without a wait counts at once,
    a waiter counts while it waits and as a refusal once it gives up; a waiter that is
    served or leaves for another reason counts nothing."""
    await support.beat(redis, "a", total=1)
    s = store(redis, redis_server.url)
    assert isinstance(await s.admit(request()), admissions.Session)
    assert await s.admit(request()) == admissions.Refused("busy", 0)
    assert await s.admit(request(), ticket="patient") == admissions.Refused("busy", 0)
    assert await s.admit(request(), ticket="polite") == admissions.Refused("busy", 1)
    assert await waiting.read(redis, "default", 60) == waiting.Unmet(waiting=2, refused=1)
    await s.leave_queue(request(), "patient", refused=True)
    await s.leave_queue(request(), "polite")
    assert await waiting.read(redis, "default", 60) == waiting.Unmet(waiting=0, refused=2)
    assert await waiting.read(redis, "other", 60) == waiting.Unmet()
    assert 0 < await redis.pttl(waiting.refusals_key("default")) <= waiting.REFUSALS_KEPT_MS


async def test_renewal_notices_a_lapsed_pod_and_gives_it_up_after_a_while(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    await support.beat(redis, "a", total=2, lease_ms=200)
    config = support.config(redis_server.url, session_lease_ms=300, pod_gone_after_ms=500)
    s = admissions.Admissions(redis, config)
    held = await s.admit(request())
    assert isinstance(held, admissions.Session)
    assert await s.renew([held]) == [True]
    await asyncio.sleep(0.3)  # the pod's lease runs out
    for _ in range(4):  # 4 renewals of 100 ms: not yet 500 ms without a heartbeat
        (alive,) = await s.renew([held])
        leasing.note_heartbeat(held, alive, config)
    assert not alive and not held.pod_gone.is_set()
    leasing.note_heartbeat(held, alive, config)
    assert held.pod_gone.is_set()


async def test_a_reservation_the_pod_never_accepted_frees_before_an_accepted_one(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    """A router that dies while dialling a pod leaves its reservation for a short while;
    a stream the pod accepted counts for the whole hold (the pod keeps it for a resume)."""
    await support.beat(redis, "a", total=2)
    s = store(
        redis, redis_server.url, session_lease_ms=200, pod_connect_timeout_seconds=0.1,
        resume_grace_seconds=30
    )
    accepted = await s.admit(request())
    dialling = await s.admit(request())
    assert isinstance(accepted, admissions.Session) and isinstance(dialling, admissions.Session)
    await s.attach(accepted)
    assert await free_of(redis) == {"a": 0}
    # the router dies here
    await support.async_wait_until(lambda: _free_is(redis, {"a": 1}), 5, "the reservation to go")
    now = registry.now_ms()
    assert (await redis.zscore(keys.pod_sessions("default", "a"), accepted.session_id) or 0) > now
    assert (await redis.zscore(keys.pod_sessions("default", "a"), dialling.session_id) or 0) <= now


async def test_queue_order_holds_however_long_the_wait(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    """Waiters polling for longer than a ticket's lease (2 s), the last to come polling
    first, keep their places: the queue and its counter live as long as their waiters
    (they expired 3 s after the last arrival, and the next polls numbered them anew)."""
    await support.beat(redis, "a", total=1)
    s = store(redis, redis_server.url, session_lease_ms=300, queue_timeout_seconds=10)
    holder = await s.admit(request())
    assert isinstance(holder, admissions.Session)
    waiters = ["first", "second", "third"]
    for rank, ticket in enumerate(waiters):
        assert await s.admit(request(), ticket=ticket) == admissions.Refused("busy", rank)
    for _ in range(26):  # 2.6 s of polls, every 100 ms, the newest first
        await asyncio.sleep(0.1)
        for rank, ticket in reversed(list(enumerate(waiters))):
            assert await s.admit(request(), ticket=ticket) == admissions.Refused("busy", rank)
    await s.release(holder)
    assert await s.admit(request(), ticket="third") == admissions.Refused("busy", 2)
    assert isinstance(await s.admit(request(), ticket="first"), admissions.Session)


async def test_the_queue_is_bounded_and_so_is_each_keys_share_of_it(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    await support.beat(redis, "a", total=1, free=0)
    s = store(redis, redis_server.url, queue_max=2, queue_max_per_key=1)
    k, j, m = request(key_id="k"), request(key_id="j"), request(key_id="m")
    assert await s.admit(k, ticket="k1") == admissions.Refused("busy", 0)
    assert await s.admit(k, ticket="k2") == admissions.Refused("key_queue_full")
    assert await s.admit(j, ticket="j1") == admissions.Refused("busy", 1)
    assert await s.admit(m, ticket="m1") == admissions.Refused("queue_full")
    assert await s.admit(k, ticket="k1") == admissions.Refused("busy", 0)  # still in
    await s.leave_queue(k, "k1")  # gone at once, its key's share with it
    assert await s.admit(k, ticket="k2") == admissions.Refused("busy", 1)
    assert await redis.zrange(keys.pool_queue("default"), 0, -1) == ["j1", "k2"]


async def test_a_detached_session_survives_a_redis_restart(redis_server: RedisServer) -> None:
    """The router that detached a session writes its record back when Redis comes back
    empty, detached for the rest of its grace, so the client can still resume; once
    resumed, it is no longer that router's to keep."""
    redis = wiring.connect_redis(support.config(redis_server.url))  # the router's own client
    await support.beat(redis, "a", total=2)
    s = store(redis, redis_server.url, resume_grace_seconds=30)
    req, held = await held_for_resume(s)
    kept = admissions.Sessions()
    kept.hold_detached(held, until=time.monotonic() + 30)
    detached = kept.detached(time.monotonic())
    assert await s.keep_detached(detached) == [True]
    redis_server.kill()
    redis_server.start()
    await support.async_wait_until(lambda: _kept(s, detached), 5, "the record written back")
    await support.beat(redis, "a", total=2)  # the pod's heartbeat refills its own keys
    record = await redis.hgetall(keys.session("default", held.session_id))
    assert (record["state"], record["conn"], record["pod"]) == ("detached", "", "a")
    assert 0 < await redis.pttl(keys.session("default", held.session_id)) <= 30_000
    assert await redis.zscore(keys.pod_sessions("default", "a"), held.session_id)
    resumed = await s.resume(admissions.Request("", "team", 0, req.token, "c2"))
    assert isinstance(resumed, admissions.Session) and resumed.pod_resume_token == "pod-token"
    assert await s.keep_detached(detached) == [False]
    await redis.aclose()


async def _kept(s: admissions.Admissions, detached: list[admissions.Detached]) -> bool:
    try:
        return await s.keep_detached(detached) == [True]
    except redis_errors.ConnectionError:
        return False


async def test_a_heartbeat_alone_does_not_make_a_pod(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    """Once the pool's real pods are listed, a pod that only heartbeats (an unlisted id,
    or a listed id at another address) gets no stream, however free it looks."""
    await support.beat(redis, "real", total=1)
    await support.beat(redis, "rogue", total=8, free=1)  # 'pack' would pick it
    s = store(redis, redis_server.url)
    await registry.publish_members(redis, "default", {"real": "127.0.0.1"})
    admitted = await s.admit(request())
    assert isinstance(admitted, admissions.Session) and admitted.pod_id == "real"
    assert await s.admit(request()) == admissions.Refused("busy", 0)  # rogue has room
    await registry.publish_members(redis, "default", {"real": "10.0.0.7", "rogue": "10.0.0.8"})
    await s.release(admitted)
    assert await s.admit(request()) == admissions.Refused("busy", 0)  # wrong IPs
    await registry.publish_members(redis, "default", {})
    assert await s.admit(request()) == admissions.Refused("busy", 0)  # no pods at all


async def test_with_members_required_a_pool_without_its_list_waits_for_it(
    redis: aioredis.Redis, redis_server: RedisServer
) -> None:
    """The list is missing (a new pool, or Redis restarted empty): any heartbeat counted,
    so a rogue could take the streams of that moment. With members_required (the
    chart's) the pool is busy until the operator lists its pods."""
    await support.beat(redis, "real", total=1)
    open_pool = store(redis, redis_server.url)
    strict = store(redis, redis_server.url, members_required=True)
    assert await strict.admit(request()) == admissions.Refused("busy", 0)
    admitted = await open_pool.admit(request())  # by hand, a bare pod and router
    assert isinstance(admitted, admissions.Session)
    await open_pool.release(admitted)
    await registry.publish_members(redis, "default", {"real": "127.0.0.1"})
    admitted = await strict.admit(request())
    assert isinstance(admitted, admissions.Session) and admitted.pod_id == "real"
    await strict.release(admitted)
