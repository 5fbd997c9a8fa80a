from tests.support.redis_servers import CLUSTER_SLOTS, RedisClusterServers, RedisServer


def test_redis_server_is_real_and_restartable(redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.set("k", "v")
    assert client.get("k") == "v"
    redis_server.kill()
    redis_server.start()
    assert redis_server.client().get("k") is None  # no persistence: a restart is empty


def test_the_redis_cluster_is_three_masters_that_share_every_slot(
        module_redis_cluster: RedisClusterServers) -> None:
    ports = {node.port for node in module_redis_cluster.nodes}
    for node in module_redis_cluster.nodes:
        with node.client() as client:
            seen = client.cluster("NODES")
        masters = {address.split("@")[0]: info for address, info in seen.items()
                   if "master" in info["flags"] and info["connected"]}
        assert {int(a.rpartition(":")[2]) for a in masters} == ports
        owned = sorted(int(s) for info in masters.values() for r in info["slots"]
                       for s in range(int(r[0]), int(r[-1]) + 1))
        assert owned == list(range(CLUSTER_SLOTS))
