"""A pool's member list (what routers admit to) follows its pods between passes:
the real operator against the kmock emulator and a real Redis, with passes far apart."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from kopf.testing import KopfRunner

from asrpool.common import processes, registry
from asrpool.operator import kube, membership, naming, settings
from tests.operator import checks, emulator
from tests.support import redis_servers
from tests.support.polling import eventually

NS = emulator.NAMESPACE
POOL = f"{NS}/stt"
OPERATOR_AGENTS = ("kopf/", "OpenAPI-Generator/")
pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def operator_settings(
    cluster: emulator.Cluster, redis_server: redis_servers.RedisServer
) -> settings.OperatorSettings:
    """No pass but the pool's first: whatever changes later is the pods' handler's."""
    return settings.OperatorSettings(
        namespaces=[NS], redis_url=redis_server.url, kube_api_url=cluster.url,
        resync_seconds=3600.0)


def _members(redis_server: redis_servers.RedisServer) -> dict[str, str]:
    found = redis_server.client().hgetall(registry.pool_members_key(POOL))
    assert registry.MEMBERS_SENTINEL in found, f"no list published yet: {found}"
    return {pod: ip for pod, ip in found.items() if pod != registry.MEMBERS_SENTINEL}


def _operator_calls(cluster: emulator.Cluster, mark: int) -> list[Any]:
    """The operator's API requests since ``mark``, but its watch streams and the Events
    of the first pass (posted in the background)."""
    return [r for r in cluster.requests_since(mark)
            if str(r.headers.get("User-Agent", "")).startswith(OPERATOR_AGENTS)
            and (r.action is None or r.action.value != "WATCH") and r.resource != emulator.EVENTS]


async def test_pods_join_and_leave_the_list_as_they_get_and_lose_their_ip(
    cluster: emulator.Cluster, operator: KopfRunner, redis_server: redis_servers.RedisServer,
) -> None:
    await checks.created(cluster)
    await eventually(lambda: checks.assert_equal(_members(redis_server), {}))  # the first pass
    await eventually(lambda: checks.condition(cluster, "Ready"))  # and its status: done
    mark = cluster.mark()
    pods = await cluster.run_deployment(NS, "stt")
    assert len(pods) == 2
    ids = [naming.pod_id(NS, pod) for pod in pods]  # as the pods heartbeat
    await eventually(lambda: checks.assert_equal(
        _members(redis_server), {ids[0]: "10.0.0.1", ids[1]: "10.0.0.2"}))

    await cluster.patch(kube.PODS, NS, pods[0], {"status": {"podIP": None}})  # lost its IP
    await eventually(lambda: checks.assert_equal(_members(redis_server), {ids[1]: "10.0.0.2"}))
    await cluster.patch(kube.PODS, NS, pods[0], {"status": {"podIP": "10.0.0.9"}})
    await eventually(lambda: checks.assert_equal(
        _members(redis_server), {ids[0]: "10.0.0.9", ids[1]: "10.0.0.2"}))
    await cluster.delete(kube.PODS, NS, pods[1])
    await eventually(lambda: checks.assert_equal(_members(redis_server), {ids[0]: "10.0.0.9"}))

    assert checks.passes(cluster, mark) == 0  # no reconcile pass ran meanwhile
    calls = [(r.method, r.resource and r.resource.plural, r.subresource)
             for r in _operator_calls(cluster, mark)]
    assert calls == []  # nor any API call: the watch alone


async def test_another_pools_pods_and_other_pods_leave_the_list_alone(
    cluster: emulator.Cluster, operator: KopfRunner, redis_server: redis_servers.RedisServer,
) -> None:
    await checks.created(cluster)
    await eventually(lambda: checks.assert_equal(_members(redis_server), {}))
    other = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "other-0", "namespace": NS, "labels": naming.selector("other")},
        "status": {"podIP": "10.0.1.1"}}
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "web-0", "namespace": NS, "labels": {naming.POOL_LABEL: "stt"}},
        "status": {"podIP": "10.0.2.1"}}  # not a server pod (no app name label)
    await cluster.create(other)
    await cluster.create(plain)
    client = redis_server.client()
    await eventually(lambda: checks.assert_equal(
        client.hgetall(registry.pool_members_key(f"{NS}/other")),
        {registry.MEMBERS_SENTINEL: "", f"{NS}/other-0": "10.0.1.1"}))
    assert _members(redis_server) == {}  # the web pod is none of the pool's


def test_an_index_entry_is_a_pod_with_an_ip_under_its_pool() -> None:
    labels = naming.selector("stt")
    assert membership.index_entry("ns", "stt-0", labels, {"podIP": "10.0.0.1"}) == {
        ("ns", "stt"): ("ns/stt-0", "10.0.0.1")}
    assert membership.index_entry("ns", "stt-0", labels, {}) == {}  # out of the index
    assert membership.index_entry("ns", "stt-0", labels, {"podIP": None}) == {}
    assert naming.registry_name("ns", "stt") == "ns/stt"
    index = {("ns", "stt"): [("ns/stt-0", "10.0.0.1"), ("ns/stt-1", "10.0.0.2")]}
    assert membership.pool_members(index, ("ns", "stt")) == {"ns/stt-0": "10.0.0.1",
                                                             "ns/stt-1": "10.0.0.2"}
    assert membership.pool_members(index, ("ns", "none")) == {}


async def test_a_list_is_written_only_when_it_changed_unless_always(
    redis_server: redis_servers.RedisServer,
) -> None:
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    published = membership.Published()
    try:
        assert await published.publish(client, POOL, lambda: {"a": "10.0.0.1"})
        assert not await published.publish(client, POOL, lambda: {"a": "10.0.0.1"})
        await client.delete(registry.pool_members_key(POOL))  # a Redis that lost it
        assert await published.publish(client, POOL, lambda: {"a": "10.0.0.1"}, always=True)
        assert await client.hgetall(registry.pool_members_key(POOL)) == {
            registry.MEMBERS_SENTINEL: "", "a": "10.0.0.1"}
    finally:
        await client.aclose()


async def test_a_failed_write_is_tried_again_at_the_next_change() -> None:
    dead = aioredis.Redis.from_url(f"redis://127.0.0.1:{processes.free_port()}/0",
                                   socket_connect_timeout=1)
    published = membership.Published()
    try:
        assert not await published.publish(dead, POOL, lambda: {"a": "10.0.0.1"})
        assert POOL not in published.lists  # unknown: the next event writes it
    finally:
        await dead.aclose()
