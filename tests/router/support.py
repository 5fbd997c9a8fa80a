"""Helpers for the router's tests: heartbeats, router and pod processes, clients."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import redis.asyncio as aioredis
import websockets
from websockets.asyncio import client as ws_client

from asrpool.common import processes, protocol, registry
from asrpool.common.processes import free_port, wait_until  # the one poll, tests too
from asrpool.router import settings
from tests.support import kyutai_client, servers


def config(redis_url: str, **overrides: Any) -> settings.RouterSettings:
    """A router's settings for pods that only heartbeat (no operator lists them): the
    member list is not required unless a test asks for it."""
    return settings.RouterSettings(redis_url=redis_url,
                                   **{"members_required": False, **overrides})


async def beat(
    redis: aioredis.Redis,
    pod_id: str,
    total: int = 4,
    free: int | None = None,
    pool: str = "default",
    draining: bool = False,
    lease_ms: int = 10_000,
    port: int = 1,
    overloaded: bool = False,
) -> registry.PodHeartbeat:
    hb = registry.PodHeartbeat(
        pod_id=pod_id,
        pool=pool,
        address=f"127.0.0.1:{port}",
        total_slots=total,
        free_slots=total if free is None else free,
        draining=draining,
        model="test",
        overloaded=overloaded,
    )
    await registry.write_heartbeat(redis, hb, lease_ms=lease_ms)
    return hb


async def async_wait_until(check: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _answers(url: str) -> bool:
    try:
        return http_get(url, timeout=0.5)[0] == 200
    except (OSError, urllib.error.URLError):
        return False


class Process:
    """A child process of this test, logged to a file, killed at the end."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None,
                 name: str = "") -> None:
        self.args, self.log_path, self.env, self.name = args, log, env, name or args[0]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # faulthandler: a process stuck past terminate's timeout writes its threads'
        # stacks to its log on the SIGABRT sent before SIGKILL.
        env = {**os.environ, "PYTHONFAULTHANDLER": "1", **(self.env or {})}
        self.proc = processes.spawn(self.name, self.args, self.log_path, env=env).process

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def terminate(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._dump_stacks_and_kill()
        return self.proc.returncode

    def _dump_stacks_and_kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGABRT)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


class RouterProcess(Process):
    def __init__(self, redis_url: str, workdir: Path, *extra: str, port: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        args = [
            sys.executable,
            "-m",
            "asrpool.cli",
            "route",
            "--redis-url",
            redis_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            # One process unless a test asks for more: /metrics and logs are then the
            # whole router's.
            *(() if "--workers" in extra else ("--workers", "1")),
            # Pods here only heartbeat (no operator lists them), unless a test asks.
            *(() if "--members-required" in extra else ("--no-members-required",)),
            # Told to stop, it stops at once (no drain grace), unless a test asks.
            *(() if "--drain-grace-seconds" in extra else ("--drain-grace-seconds", "0")),
            *extra,
        ]
        super().__init__(args, workdir / f"router-{self.port}.log", env,
                         f"router on port {self.port}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}{protocol.STREAMING_PATH}"

    def start(self) -> None:
        super().start()
        wait_until(lambda: self._up(), 30, f"router on port {self.port}")

    def _up(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"router exited:\n{self.log()}")
        return _answers(self.url + "/healthz")


POD_TOKEN = "test-pod-token"
POD_GRACE_S = 5


def pod(
    redis_url: str, workdir: Path, pod_id: str, slots: int = 4, pool: str = "default", *extra: str,
    token: str = POD_TOKEN,
) -> servers.ServerProcess:
    """A real ``asrpool serve --model tiny`` pod registered in Redis (not yet started),
    taking streams with ``token`` only."""
    port = free_port()
    args = [
        "--redis-url",
        redis_url,
        "--pool",
        pool,
        "--advertise-address",
        f"127.0.0.1:{port}",
        "--resume-grace-seconds",
        str(POD_GRACE_S),
        *extra,
    ]
    return servers.ServerProcess(
        workdir, batch_size=slots, args=args, port=port, pod_id=pod_id,
        env={"OMP_NUM_THREADS": "1", "ASRPOOL_POD_TOKEN": token},
    )


def pods_in_view(router: RouterProcess, pool: str = "default", key: str = "") -> int:
    """How many of the pool's pods the router's /api/pools shows (0 if it cannot answer);
    ``key``: a router with API keys shows it to a key holder only."""
    query = f"?{protocol.API_KEY_QUERY}={key}" if key else ""
    status, body = http_get(router.url + "/api/pools" + query)
    pools = json.loads(body)["pools"] if status == 200 else {}
    return len(pools.get(pool, {}).get("pods", []))


def router(redis_url: str, workdir: Path, *extra: str) -> RouterProcess:
    return RouterProcess(
        redis_url, workdir, "--resume-grace-seconds", str(POD_GRACE_S), *extra,
        env={"ASRPOOL_POD_TOKEN": POD_TOKEN},
    )


# Clients


@dataclasses.dataclass
class Opened:
    ws: ws_client.ClientConnection
    session_id: str
    resume_token: str


async def connect(url: str, headers: dict[str, str] | None = None) -> Opened:
    ws = await ws_client.connect(
        url,
        additional_headers=headers or {},
        proxy=None,
        compression=None,
        open_timeout=30,
        max_size=None,
    )
    got = ws.response.headers if ws.response is not None else {}
    return Opened(
        ws, got.get(protocol.SESSION_ID_HEADER, ""), got.get(protocol.RESUME_TOKEN_HEADER, "")
    )


async def first_message(ws: ws_client.ClientConnection, timeout: float = 30.0) -> dict[str, Any]:
    data = await asyncio.wait_for(ws.recv(decode=False), timeout)
    body: dict[str, Any] = msgpack.unpackb(data, raw=False)
    return body


async def until_closed(
    ws: ws_client.ClientConnection, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """Every message until the server closes."""
    out = []
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            data = await asyncio.wait_for(ws.recv(decode=False), timeout)
            out.append(msgpack.unpackb(data, raw=False))
    return out


async def transcribe(
    url: str, pcm: Any, headers: dict[str, str] | None = None, realtime: float | None = None
) -> list[dict[str, Any]]:
    """A Kyutai file-client session, ending with a clean close once the marker is back."""
    opened = await connect(url, headers)
    try:
        assert (await first_message(opened.ws))["type"] == "Ready"
        return await finish_stream(opened.ws, pcm, realtime)
    finally:
        await opened.ws.close()


def messages(pcm: Any) -> list[dict[str, Any]]:
    """A short file-client session: the audio in 80 ms chunks, a marker, 1.5 s of silence
    (more than the tiny model's delay) so that the marker comes back."""
    frame = kyutai_client.FRAME_SIZE
    out: list[dict[str, Any]] = [
        {"type": "Audio", "pcm": pcm[i : i + frame]} for i in range(0, len(pcm), frame)
    ]
    silence = np.zeros(kyutai_client.SAMPLE_RATE // 2, dtype=np.float32)
    return [*out, {"type": "Marker", "id": 0}, *[{"type": "Audio", "pcm": silence}] * 3]


async def finish_stream(
    ws: ws_client.ClientConnection, pcm: Any, realtime: float | None = None
) -> list[dict[str, Any]]:
    sender = asyncio.create_task(kyutai_client.send_paced(ws, messages(pcm), realtime))
    try:
        return await kyutai_client.until_marker(ws, 0, timeout=90)
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)


def is_marker(message: dict[str, Any], marker_id: int = 0) -> bool:
    return message.get("type") == "Marker" and message.get("id") == marker_id
