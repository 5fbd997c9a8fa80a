"""Admission never leaks and the waiting room is bounded (real router, pod and Redis):
a client that leaves while it waits or while its pod link opens leaves no queue
ticket, no session record and no pod slot behind; a full queue says so."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from asrpool.common import protocol
from tests.router import support
from tests.support import kyutai_client, servers
from tests.support.redis_servers import RedisServer


async def _upgrade(port: int, *headers: str) -> asyncio.StreamWriter:
    """A client's upgrade request, sent; it leaves with ``transport.abort()``."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write("\r\n".join([
        f"GET {protocol.STREAMING_PATH} HTTP/1.1", f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13", *headers, "", ""]).encode())
    await writer.drain()
    return writer


async def _waiting(router: support.RouterProcess, count: int) -> bool:
    status, body = await asyncio.to_thread(support.http_get, router.url + "/api/pools")
    return status == 200 and f'"waiting":{count}' in body.decode().replace(" ", "")


async def _idle(pod: servers.ServerProcess) -> bool:
    return (await asyncio.to_thread(pod.modules_info))["used_slots"] == 0


async def _nothing_held(redis: aioredis.Redis, pod_id: str) -> bool:
    records = [k for k in await redis.keys("asrpool:session:*") if not k.endswith(":ended")]
    return not records and not await redis.zcard(f"asrpool:pod:{pod_id}:sessions")


async def test_the_queue_refuses_beyond_its_bound_and_forgets_who_left(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    pod = support.pod(redis_server.url, tmp_path, "one-slot", 1)
    router = support.router(redis_server.url, tmp_path, "--queue-timeout", "60",
                            "--queue-max", "1")
    with pod:
        pod.wait_ready()
        router.start()
        try:
            holder = await support.connect(router.ws_url)
            assert (await support.first_message(holder.ws))["type"] == "Ready"
            leaver = await _upgrade(router.port)
            await support.async_wait_until(lambda: _waiting(router, 1), 10, "a waiter")
            refused = await support.connect(router.ws_url)
            told = await support.until_closed(refused.ws)
            assert [m["code"] for m in told] == ["queue_full"]
            assert "queue is full" in told[0]["message"] and refused.ws.close_code == 1013
            leaver.transport.abort()  # its ticket goes now, not when its wait would end
            await support.async_wait_until(lambda: _waiting(router, 0), 5, "the ticket to go")
            waiter = asyncio.create_task(support.connect(router.ws_url))
            await support.async_wait_until(lambda: _waiting(router, 1), 10, "the next waiter")
            await holder.ws.close()
            opened = await waiter  # the slot went to the one still there
            assert (await support.first_message(opened.ws))["type"] == "Ready"
            await opened.ws.close()
        finally:
            router.kill()


class GatedProxy:
    """A TCP proxy in front of a pod that holds what the pod says until ``gate`` is
    set: the router's admission is caught between the pod's accept and its Ready."""

    def __init__(self) -> None:
        self.target = 0
        self.answered = asyncio.Event()  # the pod has answered (101 and Ready)
        self.gate = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        pod_reader, pod_writer = await asyncio.open_connection("127.0.0.1", self.target)
        await asyncio.gather(self._pipe(reader, pod_writer, held=False),
                             self._pipe(pod_reader, writer, held=True), return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    held: bool) -> None:
        try:
            while data := await reader.read(65536):
                if held:
                    self.answered.set()
                    await self.gate.wait()
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    def close(self) -> None:
        self.server.close()


async def test_a_client_that_leaves_while_its_pod_link_opens_leaves_nothing(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The pod took the stream, the router waits for its Ready, the client leaves: the
    link is closed cleanly (the pod frees the slot at once, no resume hold) and the
    reservation released. (The router used to attach it, fail its accept with an
    exception, and leave the link open: the pod held the slot until its idle timeout.)"""
    proxy = GatedProxy()
    proxy_port = await proxy.start()
    pod = support.pod(redis_server.url, tmp_path, "gated", 1, "default",
                      "--advertise-address", f"127.0.0.1:{proxy_port}")
    proxy.target = pod.port
    router = support.router(redis_server.url, tmp_path)
    with pod:
        await asyncio.to_thread(pod.wait_ready)
        await asyncio.to_thread(router.start)
        try:
            client = await _upgrade(router.port)
            await asyncio.wait_for(proxy.answered.wait(), 30)
            assert not await _idle(pod)  # the pod holds the slot for this stream
            client.transport.abort()
            await asyncio.sleep(0.5)  # for the router to see it go (if it does later, its
            proxy.gate.set()  # accept fails instead: the same end is asserted)
            await support.async_wait_until(lambda: _idle(pod), 10, "the pod's slot to be free")
            redis = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
            await support.async_wait_until(lambda: _nothing_held(redis, "gated"), 10,
                                           "the session record to go")
            await redis.aclose()
        finally:
            router.kill()
            proxy.close()
    assert "Traceback" not in router.log()


async def test_a_detached_stream_is_resumable_after_a_redis_restart(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A client drops (resumable), Redis restarts empty: the router that held the stream
    writes its record back, and the client resumes through the router, on its pod, from
    where the pod had got to. (The record was lost: bad_resume_token while the pod still
    held the slot.)"""
    grace = "20"  # ample for a restart on a busy machine (the pods' default is 30 s)
    pod = support.pod(redis_server.url, tmp_path, "keeps", 1, "default",
                      "--resume-grace-seconds", grace)
    router = support.router(redis_server.url, tmp_path, "--resume-grace-s", grace)
    with pod:
        await asyncio.to_thread(pod.wait_ready)
        await asyncio.to_thread(router.start)
        try:
            opened = await support.connect(router.ws_url, {protocol.RESUMABLE_HEADER: "1"})
            assert (await support.first_message(opened.ws))["type"] == "Ready"
            await opened.ws.send(kyutai_client.audio(np.zeros(1920 * 3, dtype=np.float32)))
            await asyncio.sleep(0.5)  # for the pod to take the audio in
            opened.ws.transport.abort()
            await support.async_wait_until(lambda: _detached(redis_server, opened.session_id),
                                           10, "the session to be detached")
            redis_server.kill()
            redis_server.start()
            await support.async_wait_until(lambda: _detached(redis_server, opened.session_id),
                                           10, "the record to be written back")
            again = await support.connect(
                router.ws_url, {protocol.RESUME_TOKEN_HEADER: opened.resume_token})
            first = await support.first_message(again.ws)
            assert first["type"] == "Ready", first
            assert again.session_id == opened.session_id
            assert again.ws.response is not None
            assert again.ws.response.headers[protocol.RESUME_OFFSET_HEADER] == str(1920 * 3)
            await again.ws.close()
            await support.async_wait_until(lambda: _idle(pod), 10, "the pod's slot to be free")
        finally:
            router.kill()


async def _detached(redis_server: RedisServer, sid: str) -> bool:
    redis = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        return bool(await redis.hget(f"asrpool:session:{sid}", "state") == "detached")
    except redis_errors.ConnectionError:
        return False
    finally:
        await redis.aclose()


async def test_a_client_that_leaves_during_its_resume_can_resume_again(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A resuming client that drops before its 101 still holds its token: the stream
    stays held (detached), and the next resume gets it. (The router used to close the
    pod link and release the session: the stream was gone.)"""
    proxy = GatedProxy()
    proxy_port = await proxy.start()
    pod = support.pod(redis_server.url, tmp_path, "gated", 1, "default",
                      "--advertise-address", f"127.0.0.1:{proxy_port}",
                      "--resume-grace-seconds", "20")
    proxy.target = pod.port
    router = support.router(redis_server.url, tmp_path, "--resume-grace-s", "20")
    with pod:
        await asyncio.to_thread(pod.wait_ready)
        await asyncio.to_thread(router.start)
        try:
            proxy.gate.set()
            opened = await support.connect(router.ws_url, {protocol.RESUMABLE_HEADER: "1"})
            assert (await support.first_message(opened.ws))["type"] == "Ready"
            opened.ws.transport.abort()
            await support.async_wait_until(lambda: _detached(redis_server, opened.session_id),
                                           10, "the session to be detached")
            proxy.gate.clear()
            proxy.answered.clear()
            client = await _upgrade(router.port,
                                    f"{protocol.RESUME_TOKEN_HEADER}: {opened.resume_token}")
            await asyncio.wait_for(proxy.answered.wait(), 30)  # the pod gave it back
            client.transport.abort()
            await asyncio.sleep(0.3)
            proxy.gate.set()  # the router gets the pod's Ready, its accept fails
            await support.async_wait_until(lambda: _detached(redis_server, opened.session_id),
                                           10, "the session to be detached again")
            again = await support.connect(
                router.ws_url, {protocol.RESUME_TOKEN_HEADER: opened.resume_token})
            assert (await support.first_message(again.ws))["type"] == "Ready"
            assert again.session_id == opened.session_id
            await again.ws.close()
            await support.async_wait_until(lambda: _idle(pod), 10, "the pod's slot to be free")
        finally:
            router.kill()
            proxy.close()
