"""POST /api/asr-streaming through the router with real pods: a body a pod has taken is
never sent to another one, and a client that goes away frees the pod's slot."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import sphn

from tests.router import support
from tests.support import servers
from tests.support.redis_servers import RedisServer


def _long_wav(path: Path, seconds: float = 590.0) -> bytes:
    """Silence long enough that a pod holds its slot well past the test's checks."""
    sphn.write_wav(str(path), np.zeros((1, int(24_000 * seconds)), np.float32), 24_000)
    return path.read_bytes()


@contextlib.contextmanager
def _platform(redis_url: str, tmp_path: Path) -> Iterator[tuple[support.RouterProcess,
                                                                 list[servers.ServerProcess]]]:
    pods = [support.pod(redis_url, tmp_path, name, slots=1) for name in ("a-pod", "b-pod")]
    router = support.router(redis_url, tmp_path)
    try:
        for pod in pods:
            pod.start()
        for pod in pods:
            pod.wait_ready()
        router.start()
        support.wait_until(lambda: support.pods_in_view(router) == 2, 20, "both pods seen")
        yield router, pods
    finally:
        router.terminate()
        for pod in pods:
            pod.stop()


def _busy(pods: list[servers.ServerProcess], timeout: float = 60.0) -> servers.ServerProcess:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = [pod for pod in pods if pod.poll() is None and pod.modules_info()["used_slots"]]
        if busy:
            return busy[0]
        time.sleep(0.02)
    raise AssertionError("no pod took the upload")


async def test_a_pod_killed_during_an_upload_is_a_502_and_no_other_pod_gets_the_body(
        redis_server: RedisServer, tmp_path: Path) -> None:
    body = _long_wav(tmp_path / "long.wav")
    with _platform(redis_server.url, tmp_path) as (router, pods):
        answer = asyncio.create_task(asyncio.to_thread(servers.post_file, router.url, body))
        taken = await asyncio.to_thread(_busy, pods)
        (other,) = [pod for pod in pods if pod is not taken]
        taken.signal(signal.SIGKILL)
        status, text = await answer
        assert status == 502 and "not sent to another pod" in text, (status, text)
        assert other.modules_info()["used_slots"] == 0


async def test_a_client_leaving_an_upload_frees_the_pods_slot(
        redis_server: RedisServer, tmp_path: Path) -> None:
    body = _long_wav(tmp_path / "long.wav")
    with _platform(redis_server.url, tmp_path) as (router, pods):
        connection = http.client.HTTPConnection("127.0.0.1", router.port, timeout=30)
        connection.request("POST", "/api/asr-streaming", body=body,
                           headers=servers.UPLOAD_HEADERS)
        taken = await asyncio.to_thread(_busy, pods)
        assert connection.sock is not None
        connection.sock.shutdown(socket.SHUT_RDWR)
        connection.close()
        await asyncio.to_thread(taken.wait_idle, 5.0)
