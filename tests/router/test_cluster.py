"""The router's and the registry's scripts on a real Redis Cluster of three masters as
on one server: each test runs against both (``backend``). Every script's keys are in
one slot (a pool's ``{NAMESPACE/NAME}``, an API key's own), so a cluster runs them; what
crosses slots (an API key's count across pools, the pools set) is a call of its own.

A cluster client refuses a script whose keys span slots before sending it, and the
nodes refuse one that touches a key of another node's slot, so each passing walk here is
also the proof that its calls were one slot each (the MONITOR check of
test_script_keys.py proves the keys were all declared)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions
import websockets
from redis import crc

from asrpool.common import processes, protocol, redis_acl, redis_clients, registry, waiting
from asrpool.operator import autoscaling, pools, scaling, usage
from asrpool.router import admissions, keys, leasing, metrics, scripts, tokens, views
from tests.router import support, test_pods, test_script_keys
from tests.support import kyutai_client, redis_servers
from tests.support.redis_servers import RedisClusterServers, RedisServer

POOL_A, POOL_B = "ns-a/stt", "ns-b/stt"


@pytest.fixture(params=["server", "cluster"])
def backend(request: pytest.FixtureRequest, module_redis: RedisServer,
            module_redis_cluster: RedisClusterServers) -> str:
    """The URL of an emptied Redis: one server, or a cluster of three masters."""
    if request.param == "cluster":
        module_redis_cluster.flush()
        return module_redis_cluster.url
    module_redis.client().flushall()
    return module_redis.url


@pytest.fixture
async def client(backend: str) -> AsyncIterator[aioredis.Redis]:
    c = redis_clients.connect(backend, 5.0, decode_responses=True)
    yield c
    await c.aclose()


def request(pool: str, key_id: str = "", limit: int = 0, conn: str = "") -> admissions.Request:
    token = tokens.mint(pool, tokens.new_session_id())
    return admissions.Request(pool, key_id, limit, token, conn or token.session_id)


def test_the_pools_and_the_key_are_in_different_slots_of_different_nodes() -> None:
    """What makes the cross-pool tests below cross slots at all."""
    slots = {crc.key_slot(k.encode()) for k in (
        keys.session(POOL_A, "s"), keys.session(POOL_B, "s"), keys.key_sessions("team"))}
    assert len(slots) == 3
    assert crc.key_slot(registry.pod_key(POOL_A, "p").encode()) == crc.key_slot(
        keys.pool_queue(POOL_A).encode())


async def test_the_client_is_a_cluster_client_only_for_a_cluster_url(
        client: aioredis.Redis, backend: str) -> None:
    assert redis_clients.is_cluster(client) == backend.startswith("redis+cluster://")
    assert await client.ping()


async def test_every_script_runs_down_its_paths(client: aioredis.Redis, backend: str) -> None:
    await test_script_keys.every_script(client, backend)
    assert await registry.read_pool(client, "default") == []  # the pod withdrew


async def test_routers_racing_for_the_last_slot_never_both_get_it(backend: str) -> None:
    clients = [redis_clients.connect(backend, 5.0, decode_responses=True) for _ in range(6)]
    try:
        await support.beat(clients[0], "only", total=1, pool=POOL_A)
        stores = [admissions.Admissions(c, support.config(backend)) for c in clients]
        got = await asyncio.gather(*(s.admit(request(POOL_A)) for s in stores))
        assert sum(isinstance(g, admissions.Session) for g in got) == 1
        assert sorted(g.reason for g in got if isinstance(g, admissions.Refused)) == [
            scripts.Denial.BUSY] * 5
    finally:
        for c in clients:
            await c.aclose()


async def test_a_keys_limit_counts_its_streams_in_every_pool(
        client: aioredis.Redis, backend: str) -> None:
    for pool in (POOL_A, POOL_B):
        await support.beat(client, f"{pool}-0", total=2, pool=pool)
    store = admissions.Admissions(client, support.config(backend))
    first = await store.admit(request(POOL_A, "team", 1))
    assert isinstance(first, admissions.Session)
    assert await store.admit(request(POOL_B, "team", 1)) == admissions.Refused(
        scripts.Denial.KEY_LIMIT)
    await store.release(first)
    second = await store.admit(request(POOL_B, "team", 1))
    assert isinstance(second, admissions.Session) and second.pool == POOL_B
    assert await client.zrange(keys.key_sessions("team"), 0, -1) == [second.session_id]


async def test_a_refused_admission_gives_its_keys_reservation_back(
        client: aioredis.Redis, backend: str) -> None:
    await support.beat(client, "full", total=1, free=0, pool=POOL_A)
    store = admissions.Admissions(client, support.config(backend))
    assert await store.admit(request(POOL_A, "team", 1)) == admissions.Refused(
        scripts.Denial.BUSY, rank=0)
    assert await store.admit(request("no-such-pool", "team", 1)) == admissions.Refused(
        scripts.Denial.UNKNOWN_POOL)
    assert await client.zcard(keys.key_sessions("team")) == 0


async def test_a_resume_finds_its_record_by_the_pool_in_its_token(
        client: aioredis.Redis, backend: str) -> None:
    await support.beat(client, "b-0", total=2, pool=POOL_B)
    store = admissions.Admissions(client, support.config(backend))
    asked = request(POOL_B, "team", 2, conn="c1")
    held = await store.admit(asked)
    assert isinstance(held, admissions.Session)
    held.pod_resume_token = "pod-token"
    assert await store.attach(held)
    await store.detach(held)
    parsed = tokens.parse(asked.token.text)
    assert parsed is not None and parsed.pool == POOL_B
    other = admissions.Admissions(client, support.config(backend, router_id="r2"))
    moved = tokens.parse(POOL_A + asked.token.text.removeprefix(POOL_B))  # another pool's
    assert moved is not None and moved.session_id == held.session_id
    assert await other.resume(admissions.Request(moved.pool, "team", 0, moved, "c2")) == \
        admissions.Refused(scripts.Denial.BAD_RESUME_TOKEN)
    resumed = await other.resume(admissions.Request(parsed.pool, "team", 0, parsed, "c2"))
    assert isinstance(resumed, admissions.Session)
    assert (resumed.pool, resumed.pod_id, resumed.pod_resume_token) == (POOL_B, "b-0",
                                                                       "pod-token")
    assert await client.zrange(keys.key_sessions("team"), 0, -1) == [held.session_id]
    assert await client.hget(keys.session(POOL_B, held.session_id), "conn") == "c2"


async def test_one_renewal_keeps_sessions_of_several_pools_and_their_keys(
        client: aioredis.Redis, backend: str) -> None:
    store = admissions.Admissions(client, support.config(backend))
    held = []
    for pool in (POOL_A, POOL_B, "default"):
        await support.beat(client, f"{pool}-0", total=2, pool=pool)
        s = await store.admit(request(pool, "team", 5))
        assert isinstance(s, admissions.Session)
        assert await store.attach(s)
        held.append(s)
    await client.delete(keys.session(POOL_B, held[1].session_id))  # as a restart loses it
    await client.delete(keys.key_sessions("team"))
    assert await store.renew(held) == [True, True, True]
    assert await client.hget(keys.session(POOL_B, held[1].session_id), "pod") == f"{POOL_B}-0"
    assert sorted(await client.zrange(keys.key_sessions("team"), 0, -1)) == sorted(
        s.session_id for s in held)
    for s in held:
        await store.release(s)
    assert await client.zcard(keys.key_sessions("team")) == 0


async def test_the_registry_and_the_unmet_demand_read_the_same(
        client: aioredis.Redis) -> None:
    await registry.announce(client, POOL_A)  # known before any pod, in its own slot
    await registry.publish_members(client, POOL_B, {f"{POOL_B}-0": "127.0.0.1"})
    await support.beat(client, f"{POOL_B}-0", total=3, pool=POOL_B)
    assert await registry.read_pools(client) == [POOL_A, POOL_B]
    assert await client.exists(registry.pool_known_key(POOL_A), registry.pool_known_key(
        POOL_B)) == 2
    assert [b.pod_id for b in await registry.read_pool(client, POOL_B)] == [f"{POOL_B}-0"]
    assert [p.load.free for p in await views.read_pool(client, POOL_B)] == [3]
    assert await waiting.read(client, POOL_A, 60) == waiting.Unmet()


async def test_a_router_and_a_pod_on_a_cluster_serve_and_resume_a_stream(
        module_redis_cluster: RedisClusterServers, tmp_path: Path) -> None:
    """Real processes on a ``redis+cluster://`` URL: the pod beats, the router admits
    and relays; its resume token carries the pool, so another router resumes it."""
    module_redis_cluster.flush()
    url = module_redis_cluster.url
    pod = support.pod(url, tmp_path, "only", slots=2)
    first, second = (support.router(url, tmp_path) for _ in range(2))
    with test_pods.running(pod, first, second):
        test_pods.wait_for_pods(first, 1)
        pcm = test_pods.audio(7, seconds=3.0)
        messages = support.messages(pcm)
        half = len(messages) // 2
        opened = await support.connect(first.ws_url)
        assert opened.resume_token.startswith(f"{registry.DEFAULT_POOL}.")
        got: list[dict[str, Any]] = [await support.first_message(opened.ws)]
        await kyutai_client.send_paced(opened.ws, messages[:half])
        got += await test_pods._quiet(opened.ws)
        first.kill()
        with contextlib.suppress(websockets.ConnectionClosed):
            await opened.ws.recv()
        again = await support.connect(
            second.ws_url, {protocol.RESUME_TOKEN_HEADER: opened.resume_token})
        assert again.session_id == opened.session_id
        assert (await support.first_message(again.ws))["type"] == "Ready"
        sender = asyncio.create_task(kyutai_client.send_paced(again.ws, messages[half:]))
        got += await kyutai_client.until_marker(again.ws, 0, timeout=60)
        await sender
        await again.ws.close()
        assert [m["type"] for m in got].count("Ready") == 1
        assert pod.metric("asr_resumes_total") == 1


async def test_the_cluster_refuses_a_script_whose_keys_span_two_pools(
        module_redis_cluster: RedisClusterServers) -> None:
    """What every passing test above would have met with the keys as they were (the
    pools set beside a pool's keys, an API key's count beside a pod's)."""
    client = redis_clients.connect(module_redis_cluster.url, 5.0)
    try:
        script = client.register_script("return redis.call('EXISTS', KEYS[1], KEYS[2])")
        assert await script(keys=[keys.pool_queue(POOL_A), keys.session(POOL_A, "s")]) == 0
        with pytest.raises(redis.exceptions.RedisClusterException, match="same key slot"):
            await script(keys=[keys.pool_queue(POOL_A), keys.pool_queue(POOL_B)])
    finally:
        await client.aclose()


async def test_a_namespaces_pod_user_is_set_on_every_node_and_reaches_its_pools_only(
        client: aioredis.Redis, backend: str) -> None:
    """The operator sets the pod user on every node (each keeps its own users); the pod's
    cluster client may read the slot map, and beats into its namespace's pools wherever
    their slots are, never into another namespace's."""
    await redis_acl.ensure_pod_user(client, "b", "pw-b")
    pools = [f"b/p{i}" for i in range(6)]
    share = redis_servers.CLUSTER_SLOTS // 3  # RedisClusterServers' split
    nodes = {min(crc.key_slot(registry.pool_tag(p).encode()) // share, 2) for p in pools}
    assert nodes == {0, 1, 2}  # the pools' slots are spread over the three masters
    pod = redis_clients.connect(redis_clients.with_username(backend, redis_acl.pod_user("b")),
                                5.0, password="pw-b")
    try:
        for i, pool in enumerate(pools):
            assert await registry.write_heartbeat(pod, _beat(f"b/x{i}", pool), announce=False)
        with pytest.raises(redis.exceptions.ResponseError, match="one of the keys"):
            await registry.write_heartbeat(pod, _beat("a/x", "a/p"), announce=False)
    finally:
        await pod.aclose()
    assert [[b.pod_id for b in await registry.read_pool(client, p)] for p in pools] == [
        [f"b/x{i}"] for i in range(6)]
    assert await registry.read_pool(client, "a/p") == []


def _beat(pod_id: str, pool: str) -> registry.PodHeartbeat:
    return registry.PodHeartbeat(pod_id=pod_id, pool=pool, address="10.0.0.9:8080",
                                 total_slots=4, free_slots=4, draining=False, model="tiny")


def test_the_client_without_an_event_loop_reaches_every_node(
        module_redis_cluster: RedisClusterServers) -> None:
    url = module_redis_cluster.url
    assert processes.redis_answers(url)
    client = redis_clients.connect_sync(url, 5.0, decode_responses=True)
    try:
        assert redis_clients.is_cluster(client)
        for pool in (POOL_A, POOL_B, "default"):
            client.set(registry.pool_known_key(pool), "1")
        assert client.exists(*(registry.pool_known_key(p) for p in (POOL_A, POOL_B))) == 2
    finally:
        client.close()


async def test_many_detached_sessions_of_two_pools_are_rebuilt_and_counted_again(
        client: aioredis.Redis, backend: str) -> None:
    """More calls than a cluster takes at once (admissions.CLUSTER_CALLS_AT_ONCE): each
    lost record is written back and counted against its pod and its key again."""
    store = admissions.Admissions(client, support.config(backend))
    held = admissions.Sessions()
    for pool in (POOL_A, POOL_B):
        await support.beat(client, f"{pool}-0", total=25, pool=pool)
    detached = []
    for i in range(2 * 20):
        s = await store.admit(request((POOL_A, POOL_B)[i % 2], "team", 100))
        assert isinstance(s, admissions.Session)
        s.pod_resume_token = f"pod-token-{i}"
        assert await store.attach(s)
        await store.detach(s)
        held.hold_detached(s, until=time.monotonic() + 60)
        detached.append(s)
    assert len(detached) > admissions.CLUSTER_CALLS_AT_ONCE
    for s in detached:
        await client.delete(keys.session(s.pool, s.session_id))
    await client.delete(keys.key_sessions("team"), *(
        keys.pod_sessions(p, f"{p}-0") for p in (POOL_A, POOL_B)))
    await leasing.keep_detached(store, held, metrics.Metrics())
    for s in detached:
        assert await client.hget(keys.session(s.pool, s.session_id), "state") == "detached"
    assert await client.zcard(keys.key_sessions("team")) == len(detached)
    assert [await client.zcard(keys.pod_sessions(p, f"{p}-0")) for p in (POOL_A, POOL_B)
            ] == [20, 20]


async def test_the_operator_wakes_a_pool_and_reads_its_demand_where_routers_write_it(
        client: aioredis.Redis, backend: str) -> None:
    """An autoscaled pool with no pod: the operator's pass announces it under its registry
    name (NAMESPACE/NAME, as the routers key it), so a client is refused ``busy`` (not
    ``unknown_pool``) and that refusal is the operator's demand."""
    pool = pools.from_body({"metadata": {"name": "sleepy", "namespace": "ns-a"}, "spec": {
        "model": {"name": "tiny"}, "slots": 8, "slotsPerPod": 8,
        "autoscaling": {"enabled": True, "minSlots": 0, "maxSlots": 16}}})
    store = admissions.Admissions(client, support.config(backend))
    assert await store.admit(request(pool.registry_name)) == admissions.Refused(
        scripts.Denial.UNKNOWN_POOL)
    assert await scaling.read_demand(client, pool, usage.Usage(), 60) == autoscaling.Demand(0)
    assert await store.admit(request(pool.registry_name)) == admissions.Refused(
        scripts.Denial.BUSY, rank=0)
    assert await scaling.read_demand(client, pool, usage.Usage(), 60) == autoscaling.Demand(
        0, refused=1)
