"""Redis users per pool namespace (asrpool.common.redis_acl), in a real Redis: a pod with
namespace B's credentials keeps its own heartbeat and touches nothing of namespace A's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from asrpool.common import redis_acl, redis_clients, registry, seeds
from asrpool.router import keys
from tests.support import polling, redis_servers, servers

SEED = "operator-seed"


def _beat(pod_id: str, pool: str) -> registry.PodHeartbeat:
    return registry.PodHeartbeat(pod_id=pod_id, pool=pool, address="10.0.0.9:8080",
                                 total_slots=4, free_slots=4, draining=False, model="tiny")


def _user_url(server: redis_servers.RedisServer, namespace: str) -> str:
    return f"redis://{redis_acl.pod_user(namespace)}@127.0.0.1:{server.port}/0"


@pytest.fixture
async def admin(redis_server: redis_servers.RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url)
    for namespace in ("a", "b"):
        await redis_acl.ensure_pod_user(client, namespace, seeds.redis_password(SEED, namespace))
    yield client
    await client.aclose()


@pytest.fixture
async def pod_b(admin: aioredis.Redis, redis_server: redis_servers.RedisServer
                ) -> AsyncIterator[aioredis.Redis]:
    client = redis_clients.connect(_user_url(redis_server, "b"), 2.0,
                                   password=seeds.redis_password(SEED, "b"))
    yield client
    await client.aclose()


async def test_a_pod_user_beats_claims_and_withdraws_in_its_own_namespace(
        pod_b: aioredis.Redis, admin: aioredis.Redis) -> None:
    await registry.claim_at_start(pod_b, "b/stt", "b/stt-1", "me")
    assert await registry.write_heartbeat(pod_b, _beat("b/stt-1", "b/stt"), instance="me",
                                          announce=False)
    assert [beat.pod_id for beat in await registry.read_pool(admin, "b/stt")] == ["b/stt-1"]
    assert await registry.remove_pod(pod_b, "b/stt-1", "b/stt", "me")
    assert await registry.read_pool(admin, "b/stt") == []


@pytest.mark.parametrize("pod_id, pool", [
    ("a/stt-1", "a/stt"),  # another namespace's pod, in its own pool
    ("b/stt-1", "a/stt"),  # its own pod id, into another namespace's pool
    ("a/stt-1", "b/stt"),  # another namespace's pod id, into its own pool
    ("stt-1", "stt"),      # ids and pools outside any namespace (the local platform's)
])
async def test_a_pod_user_cannot_register_outside_its_namespace(
        pod_b: aioredis.Redis, admin: aioredis.Redis, pod_id: str, pool: str) -> None:
    with pytest.raises(redis.exceptions.ResponseError, match="one of the keys"):
        await registry.write_heartbeat(pod_b, _beat(pod_id, pool), announce=False)
    assert await registry.read_pool(admin, pool) == []
    assert not await admin.exists(registry.pod_key(pool, pod_id))


async def test_a_pod_user_cannot_list_members_announce_pools_or_touch_sessions(
        pod_b: aioredis.Redis, admin: aioredis.Redis) -> None:
    await registry.publish_members(admin, "a/stt", {"a/stt-1": "10.0.0.1"})
    for pool in ("a/stt", "b/stt"):  # the member lists are the operator's, its own too
        with pytest.raises(redis.exceptions.NoPermissionError):
            await registry.publish_members(pod_b, pool, {"b/rogue": "10.0.0.9"})
    assert await admin.hgetall(registry.pool_members_key("a/stt")) == {
        registry.MEMBERS_SENTINEL.encode(): b"", b"a/stt-1": b"10.0.0.1"}
    with pytest.raises(redis.exceptions.ResponseError, match="one of the keys"):
        await registry.write_heartbeat(pod_b, _beat("b/stt-1", "b/stt"))  # announce: known
    assert await admin.smembers(registry.POOLS_KEY) == {b"a/stt"}
    for key in (keys.session("b/stt", "s1"), keys.pool_queue("a/stt"), keys.pool_queue("b/stt"),
                keys.pod_sessions("b/stt", "b/stt-1")):  # its own pod's session count too
        with pytest.raises(redis.exceptions.NoPermissionError):
            await pod_b.set(key, "x")


@pytest.mark.parametrize("command", [("FLUSHALL",), ("SCRIPT", "FLUSH"), ("KEYS", "*"),
                                     ("CLIENT", "KILL", "TYPE", "normal"), ("ACL", "LIST"),
                                     ("CONFIG", "GET", "*"), ("PUBLISH", "c", "x"),
                                     # a script that wrote, then looped, would stall Redis
                                     # for every namespace, unkillable (SCRIPT KILL refuses)
                                     ("EVAL", "return 1", "0"), ("SCRIPT", "LOAD", "return 1"),
                                     ("EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db",
                                      "0")])
async def test_a_pod_user_has_no_keyless_command_that_reaches_other_namespaces(
        pod_b: aioredis.Redis, command: tuple[str, ...]) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        await pod_b.execute_command(*command)


async def test_setting_the_user_again_is_idempotent_and_a_wrong_password_is_refused(
        admin: aioredis.Redis, redis_server: redis_servers.RedisServer) -> None:
    before = await admin.execute_command("ACL", "GETUSER", redis_acl.pod_user("b"))
    await redis_acl.ensure_pod_user(admin, "b", seeds.redis_password(SEED, "b"))
    assert await admin.execute_command("ACL", "GETUSER", redis_acl.pod_user("b")) == before
    wrong = redis_clients.connect(_user_url(redis_server, "b"), 2.0,
                                  password=seeds.redis_password(SEED, "a"))
    with pytest.raises(redis.exceptions.AuthenticationError):
        await wrong.ping()
    await wrong.aclose()


async def test_a_real_server_pod_heartbeats_with_its_namespace_user(
        tmp_path: Path, admin: aioredis.Redis, redis_server: redis_servers.RedisServer) -> None:
    env = {"ASRPOOL_REDIS_PASSWORD": seeds.redis_password(SEED, "b")}
    with servers.ServerProcess(tmp_path, pod_id="b/stt-1", env=env, args=[
            "--redis-url", _user_url(redis_server, "b"), "--pool", "b/stt",
            "--no-announce-pool", "--advertise-address", "10.0.0.9:8080"]) as server:
        server.wait_ready()
        watcher = redis_server.client()
        await polling.until(lambda: watcher.exists(registry.pod_key("b/stt", "b/stt-1")))
        assert [b.pod_id for b in await registry.read_pool(admin, "b/stt")] == ["b/stt-1"]
        assert "heartbeat to Redis failed" not in server.log()
        server.stop()  # a clean exit withdraws the pod, with the same user
        assert not watcher.exists(registry.pod_key("b/stt", "b/stt-1"))


async def test_under_sentinel_the_pod_user_is_on_every_node_and_outlives_a_failover(
    tmp_path: Path
) -> None:
    """ACL users are not replicated: the promoted replica must have them already."""
    sentinels = redis_servers.RedisSentinelServers(tmp_path)
    sentinels.start()
    try:
        operator = redis_clients.connect(sentinels.url, 2.0)
        await redis_acl.ensure_pod_user(operator, "speech", "pw-speech")
        await operator.aclose()
        for server in sentinels.servers:
            with server.client() as node:
                assert node.acl_getuser(redis_acl.pod_user("speech")) is not None, server.port
        sentinels.primary().kill()
        pod = redis_clients.connect(
            redis_clients.with_username(sentinels.url, redis_acl.pod_user("speech")), 2.0,
            password="pw-speech")
        try:
            await _until_written(pod, _beat("speech/stt-1", "speech/stt"))
            assert sentinels.primary().process is not None  # a replica, promoted
        finally:
            await pod.aclose()
    finally:
        sentinels.stop()


async def _until_written(client: aioredis.Redis, beat: registry.PodHeartbeat) -> None:
    """The pod user's heartbeat, once the sentinels have promoted a replica."""
    for _ in range(150):
        try:
            await registry.write_heartbeat(client, beat, announce=False)
            return
        except redis.exceptions.ConnectionError:
            await asyncio.sleep(0.2)
    raise AssertionError("the pod user could not write after the failover")
