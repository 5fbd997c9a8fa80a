"""Redis ACLs (a password seed): the real operator, against the kmock emulator and a real
Redis, keeps a Redis user per pool namespace, and says so when it cannot."""

from __future__ import annotations

import base64

import pytest
import redis
import redis.asyncio as aioredis
from kopf.testing import KopfRunner

from asrpool.common import redis_acl, redis_clients, registry, seeds
from asrpool.operator import settings
from tests.operator import checks, emulator
from tests.support import redis_servers
from tests.support.polling import eventually

NS = emulator.NAMESPACE
POOL = f"{NS}/stt"
SEED = "redis-seed"
pytestmark = pytest.mark.timeout(90)
# The operator's own Redis user: every key, and ACL rights or not.
RIGHTS = {"acl": ["~*", "+@all"], "no-acl": ["~*", "+@all", "-acl"]}


@pytest.fixture
def operator_settings(
    cluster: emulator.Cluster, redis_server: redis_servers.RedisServer,
    request: pytest.FixtureRequest,
) -> settings.OperatorSettings:
    rights = RIGHTS[getattr(request, "param", "acl")]
    redis_server.client().execute_command("ACL", "SETUSER", "asrpool-operator", "on", ">op-pw",
                                          *rights)
    return settings.OperatorSettings(
        namespaces=[NS], redis_url=f"redis://asrpool-operator@127.0.0.1:{redis_server.port}/0",
        redis_password="op-pw", redis_password_seed=SEED, kube_api_url=cluster.url,
        resync_seconds=1.0)


def _user(redis_server: redis_servers.RedisServer) -> object:
    found = redis_server.client().execute_command("ACL", "GETUSER", redis_acl.pod_user(NS))
    assert found, "no Redis user for the namespace yet"
    return found


async def test_the_namespaces_user_lets_its_pods_beat_and_comes_back_after_a_loss(
    cluster: emulator.Cluster, operator: KopfRunner, redis_server: redis_servers.RedisServer,
) -> None:
    await checks.created(cluster)
    await eventually(lambda: _user(redis_server))
    secret = cluster.get(emulator.SECRETS, NS, "stt-redis")
    assert secret is not None
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert password == seeds.redis_password(SEED, NS)
    config_map = cluster.get(emulator.CONFIG_MAPS, NS, "stt-config")
    assert config_map is not None
    pod = redis_clients.connect(config_map["data"]["ASRPOOL_REDIS_URL"], 2.0, password=password)
    try:
        beat = registry.PodHeartbeat(f"{NS}/stt-0", POOL, "10.0.0.1:8080", 8, 8, False, "m")
        assert await registry.write_heartbeat(pod, beat, announce=False)
        with pytest.raises(redis.ResponseError):  # the pools set is the operator's
            await registry.write_heartbeat(pod, beat)
    finally:
        await pod.aclose()
    await eventually(lambda: checks.assert_equal(
        POOL in redis_server.client().smembers(registry.POOLS_KEY), True))

    redis_server.client().execute_command("ACL", "DELUSER", redis_acl.pod_user(NS))  # a restart
    await eventually(lambda: _user(redis_server))
    degraded = await eventually(lambda: checks.condition(cluster, "Degraded"))
    assert degraded["status"] == "False", degraded


@pytest.mark.parametrize("operator_settings", ["no-acl"], indirect=True)
async def test_an_operator_without_acl_rights_says_so_in_the_pools_status(
    cluster: emulator.Cluster, operator: KopfRunner, redis_server: redis_servers.RedisServer,
) -> None:
    await checks.created(cluster)
    degraded = await eventually(lambda: checks.assert_degraded(cluster))
    assert degraded["reason"] == "RedisUserMissing", degraded
    assert f"Redis user {redis_acl.pod_user(NS)}" in degraded["message"]
    assert "ACL rights" in degraded["message"]
    assert "op-pw" not in degraded["message"]
    admin = aioredis.Redis.from_url(redis_server.url)
    try:  # the rest of the pass still ran: its member list is there
        assert await admin.exists(registry.pool_members_key(POOL))
    finally:
        await admin.aclose()
