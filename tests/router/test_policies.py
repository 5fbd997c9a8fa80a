"""Placement: the pure policy functions, and the admission Lua script agreeing with them."""

from __future__ import annotations

import asyncio

import hypothesis
import redis.asyncio as aioredis
from hypothesis import strategies as st

from asrpool.common import registry
from asrpool.router import admissions, keys, policies, tokens
from tests.router import support
from tests.support.redis_servers import RedisServer


def pod(pod_id: str, total: int, used: int, draining: bool = False) -> policies.PodLoad:
    return policies.PodLoad(pod_id, f"{pod_id}:1", total, used, draining)


def test_pack_takes_the_busiest_pod_with_room() -> None:
    pods = [pod("a", 4, 1), pod("b", 4, 3), pod("c", 4, 4), pod("d", 4, 0)]
    assert policies.choose_pod(pods, "pack").pod_id == "b"


def test_spread_takes_the_emptiest_pod() -> None:
    pods = [pod("a", 4, 1), pod("b", 4, 3), pod("c", 8, 4), pod("d", 4, 0)]
    assert policies.choose_pod(pods, "spread").pod_id == "c"


def test_ties_go_to_the_smallest_pod_id() -> None:
    pods = [pod("b", 4, 2), pod("a", 4, 2)]
    for policy in policies.POLICIES:
        assert policies.choose_pod(pods, policy).pod_id == "a"


def test_draining_full_and_excluded_pods_are_never_chosen() -> None:
    pods = [pod("a", 4, 0, draining=True), pod("b", 4, 4), pod("c", 4, 1)]
    for policy in policies.POLICIES:
        assert policies.choose_pod(pods, policy, exclude={"c"}) is None
        assert policies.choose_pod(pods, policy).pod_id == "c"


def test_effective_use_never_undercounts() -> None:
    assert policies.effective_used(reported_used=0, router_sessions=3) == 3
    assert policies.effective_used(reported_used=3, router_sessions=1) == 3


def test_queue_admits_first_come_first_served() -> None:
    assert policies.queue_may_admit(rank=0, free=1)
    assert not policies.queue_may_admit(rank=1, free=1)
    assert not policies.queue_may_admit(rank=0, free=0)


pod_ids = st.text(alphabet="abcdefgh0123", min_size=1, max_size=4)
loads = st.builds(
    lambda total, used, draining: (total, min(used, total), draining),
    st.integers(1, 6),
    st.integers(0, 6),
    st.booleans(),
)
snapshots = st.dictionaries(pod_ids, loads, min_size=0, max_size=6)


@hypothesis.given(snapshots, st.sampled_from(policies.POLICIES))
def test_choice_is_optimal(
    snapshot: dict[str, tuple[int, int, bool]], policy: policies.Policy
) -> None:
    pods = [pod(i, t, u, d) for i, (t, u, d) in snapshot.items()]
    chosen = policies.choose_pod(pods, policy)
    room = policies.eligible(pods)
    if not room:
        assert chosen is None
        return
    assert chosen in room
    best = min(p.free for p in room) if policy == "pack" else max(p.free for p in room)
    assert chosen.free == best


@hypothesis.settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(
    snapshot=snapshots,
    sessions=st.dictionaries(pod_ids, st.integers(0, 6), max_size=6),
    policy=st.sampled_from(policies.POLICIES),
)
def test_lua_admission_mirrors_the_policy(
    redis_server: RedisServer,
    snapshot: dict[str, tuple[int, int, bool]],
    sessions: dict[str, int],
    policy: policies.Policy,
) -> None:
    """The pod the Lua script reserves is the one ``choose_pod`` picks from the same
    snapshot, with routers' sessions counted as ``effective_used`` counts them."""

    async def check() -> None:
        redis = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        try:
            await redis.flushdb()
            expected = await _write_snapshot(redis, snapshot, sessions)
            store = admissions.Admissions(redis, support.config(redis_server.url, policy=policy))
            token = tokens.mint("default", tokens.new_session_id())
            got = await store.admit(admissions.Request("default", "", 0, token, "c"))
            want = policies.choose_pod(expected, policy)
            if want is None:
                assert isinstance(got, admissions.Refused)
            else:
                assert isinstance(got, admissions.Session) and got.pod_id == want.pod_id
        finally:
            await redis.aclose()

    asyncio.run(check())


async def _write_snapshot(
    redis: aioredis.Redis, snapshot: dict[str, tuple[int, int, bool]], sessions: dict[str, int]
) -> list[policies.PodLoad]:
    await registry.announce(redis, "default")
    out = []
    for pod_id, (total, used, draining) in snapshot.items():
        await support.beat(redis, pod_id, total, total - used, draining=draining)
        held = sessions.get(pod_id, 0)
        for n in range(held):
            await redis.zadd(keys.pod_sessions("default", pod_id), {f"s{n}": 10**13})
        effective = policies.effective_used(used, held)
        out.append(pod(pod_id, total, effective, draining))
    return out


def test_cost_of_a_pool_at_its_current_load() -> None:
    from asrpool.router import views

    priced = views.Pricing(gpu_hour_price=2.0, gpus_per_pod=1.0)
    assert views.cost(priced, pods=2, streams=400) == {
        "gpus": 2.0, "cents_per_hour": 400.0, "cents_per_audio_hour": 1.0}
    assert views.cost(priced, pods=2, streams=0)["cents_per_audio_hour"] is None
    assert views.cost(views.Pricing(None), pods=2, streams=5)["cents_per_hour"] is None
    assert views.cost(views.Pricing(3.0, gpus_per_pod=2), 1, 3)["cents_per_audio_hour"] == 200


def test_no_configured_price_is_nan_on_metrics() -> None:
    from asrpool.router import metrics

    assert b"asrpool_router_gpu_hour_price_dollars NaN" in metrics.Metrics().exposition()
