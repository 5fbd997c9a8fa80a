"""The byte relay against a real router process and fake pods that misbehave on purpose.

Each fake pod is a raw asyncio server in the test's own loop: it answers the upgrade
and a ``Ready``, then does one thing wrong (or right) and records what reached it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import msgpack
import pytest
import redis.asyncio as aioredis
import websockets
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio import client as ws_client

from asrpool.common import registry
from asrpool.router import frames, keys
from tests.router import support
from tests.support.redis_servers import RedisServer

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
READY = frames.frame(frames.BINARY, msgpack.packb({"type": "Ready"}))
WORD = frames.frame(frames.BINARY, msgpack.packb({"type": "Word", "text": "hi", "start_time": 0.5}))
AUDIO = msgpack.packb({"type": "Audio", "pcm": [0.0] * 1920}, use_single_float=True)

Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "FakePod"], Awaitable[None]]


class FakePod:
    def __init__(self, behaviour: Behaviour, first: bytes = READY) -> None:
        self.behaviour, self.received = behaviour, bytearray()
        self.first = first  # sent right behind the 101
        self.done = asyncio.Event()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        key = next(
            line.split(":", 1)[1].strip()
            for line in head.split("\r\n")
            if line.lower().startswith("sec-websocket-key:")
        )
        accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest())
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n" + self.first
        )
        try:
            await self.behaviour(reader, writer, self)
        finally:
            self.done.set()
            writer.close()

    async def read_until_eof(self, reader: asyncio.StreamReader, timeout: float = 10) -> None:
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                self.received += chunk


@pytest.fixture(scope="module")
def router(
    module_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[support.RouterProcess]:
    proc = support.RouterProcess(module_redis.url, tmp_path_factory.mktemp("router"))
    proc.start()
    yield proc
    proc.terminate()




async def start(redis: aioredis.Redis, pool: str, behaviour: Behaviour,
                first: bytes = READY) -> FakePod:
    pod = FakePod(behaviour, first)
    port = await pod.start()
    await support.beat(redis, f"{pool}-pod", total=8, pool=pool, port=port, lease_ms=60_000)
    return pod


async def connect(router: support.RouterProcess, pool: str) -> ws_client.ClientConnection:
    ws = await ws_client.connect(f"{router.ws_url}?pool={pool}", max_size=None, proxy=None)
    assert msgpack.unpackb(await ws.recv()) == {"type": "Ready"}
    return ws


async def slot_freed(redis: aioredis.Redis, pool: str) -> None:
    """Until the pool's one pod (started by :func:`start`) counts no session."""
    async with asyncio.timeout(10):
        while await redis.zcard(keys.pod_sessions(pool, f"{pool}-pod")):
            await asyncio.sleep(0.1)


def close_code_of(data: bytes) -> int | None:
    """The code of the first close frame in a client's masked flow, if any."""
    scanner = frames.Scanner(True, 1 << 30, frozenset({frames.CLOSE}))
    scan = scanner.feed(data)
    closes = [c for c in scan.controls if c.opcode == frames.CLOSE]
    return frames.close_code(closes[0].payload)[0] if closes else None


async def test_bytes_behind_the_ready_reach_the_client(
    router: support.RouterProcess, redis: aioredis.Redis
) -> None:
    async def backlog(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pod: FakePod):
        writer.write(WORD * 3)  # a resume's backlog, sent right behind the Ready
        await pod.read_until_eof(reader)

    pod = await start(redis, "relay-backlog", backlog)
    ws = await connect(router, "relay-backlog")
    words = [msgpack.unpackb(await ws.recv()) for _ in range(3)]
    assert [w["type"] for w in words] == ["Word"] * 3
    await ws.close()
    await asyncio.wait_for(pod.done.wait(), 10)
    assert close_code_of(bytes(pod.received)) == 1000  # a clean close: the pod frees the slot
    await slot_freed(redis, "relay-backlog")


async def test_a_pod_that_closes_mid_frame_drops_the_client_and_frees_the_slot(
    router: support.RouterProcess, redis: aioredis.Redis
) -> None:
    async def half_a_frame(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: FakePod):
        await reader.read(1)  # the client's first audio
        writer.write(frames.frame(frames.BINARY, b"w" * 1000)[:200])
        await writer.drain()

    await start(redis, "relay-midframe", half_a_frame)
    other = await start(redis, "relay-healthy", _echo_words)
    ws, healthy = await connect(router, "relay-midframe"), await connect(router, "relay-healthy")
    await ws.send(AUDIO)
    with pytest.raises(websockets.ConnectionClosed) as caught:
        while True:
            await asyncio.wait_for(ws.recv(), 10)
    assert caught.value.rcvd is None  # no close frame could follow half a frame
    await slot_freed(redis, "relay-midframe")
    await healthy.send(AUDIO)  # another stream on the same router is untouched
    assert msgpack.unpackb(await asyncio.wait_for(healthy.recv(), 10))["type"] == "Word"
    await healthy.close()
    await asyncio.wait_for(other.done.wait(), 10)


async def _echo_words(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pod: FakePod):
    while chunk := await reader.read(65536):
        pod.received += chunk
        writer.write(WORD)


async def test_garbage_after_admission_is_a_protocol_error_and_never_reaches_the_pod(
    router: support.RouterProcess, redis: aioredis.Redis
) -> None:
    pod = await start(redis, "relay-garbage", _echo_words)
    ws = await connect(router, "relay-garbage")
    ws.transport.write(b"\x83\x05garbage that is no frame")  # opcode 3, unmasked
    with pytest.raises(websockets.ConnectionClosed) as caught:
        await asyncio.wait_for(ws.recv(), 10)
    assert caught.value.rcvd is not None and caught.value.rcvd.code == 1002
    await asyncio.wait_for(pod.done.wait(), 10)
    assert b"garbage" not in pod.received
    assert close_code_of(bytes(pod.received)) == 1000
    await slot_freed(redis, "relay-garbage")


async def test_the_router_answers_the_pods_pings(
    router: support.RouterProcess, redis: aioredis.Redis
) -> None:
    async def pinging(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pod: FakePod):
        writer.write(frames.frame(frames.PING, b"ping") + WORD)
        await pod.read_until_eof(reader)

    pod = await start(redis, "relay-ping", pinging)
    ws = await connect(router, "relay-ping")
    assert msgpack.unpackb(await ws.recv())["type"] == "Word"
    await ws.close()
    await asyncio.wait_for(pod.done.wait(), 10)
    scan = frames.Scanner(True, 1 << 30, frozenset({frames.PONG, frames.CLOSE})).feed(
        bytes(pod.received)
    )
    assert frames.Control(frames.PONG, b"ping") in scan.controls


async def _streams_on_both_workers(
    router: support.RouterProcess, redis: aioredis.Redis, pool: str, count: int
) -> list[ws_client.ClientConnection]:
    """``count`` streams of which both workers hold some: the kernel spreads connections
    over the workers' sockets, and a worker still starting takes none yet."""
    async with asyncio.timeout(60):
        while True:
            streams = [await connect(router, pool) for _ in range(count)]
            if len(await _routers_of(redis, pool)) == 2:
                return streams
            for ws in streams:
                await ws.close()
            await slot_freed(redis, pool)


async def _routers_of(redis: aioredis.Redis, pool: str) -> set[str]:
    """The router ids (one per worker) that hold the sessions of the pool's one pod."""
    sids = await redis.zrange(keys.pod_sessions(pool, f"{pool}-pod"), 0, -1)
    return {await redis.hget(keys.session(pool, sid), "router") for sid in sids} - {None}


def _scrape(url: str) -> dict[str, float]:
    """Each metric's samples summed over their labels."""
    with urllib.request.urlopen(url, timeout=5) as response:
        families = text_string_to_metric_families(response.read().decode())
    return {s.name: sum(x.value for x in f.samples if x.name == s.name)
            for f in families for s in f.samples}


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


async def test_workers_share_the_port_and_end_with_the_parent(
    module_redis: RedisServer, redis: aioredis.Redis, tmp_path: Path
) -> None:
    proc = support.RouterProcess(module_redis.url, tmp_path, "--workers", "2")
    proc.start()
    try:
        assert proc.proc is not None
        workers = _children(proc.proc.pid)
        assert len(workers) == 2
        pod = await start(redis, "relay-workers", _echo_words)
        streams = await _streams_on_both_workers(proc, redis, "relay-workers", 6)
        for ws in streams:
            await ws.send(AUDIO)
            assert msgpack.unpackb(await asyncio.wait_for(ws.recv(), 10))["type"] == "Word"
        # Whichever worker answers a scrape counts the streams of both.
        admitted = set()
        for _ in range(6):
            scraped = await asyncio.to_thread(_scrape, proc.url + "/metrics")
            assert scraped["asrpool_router_sessions_open"] == len(streams)
            admitted.add(scraped["asrpool_router_admissions_total"])
        assert len(admitted) == 1 and admitted.pop() >= len(streams)
        for ws in streams:
            await ws.close()
        await slot_freed(redis, "relay-workers")
        scraped = await asyncio.to_thread(_scrape, proc.url + "/metrics")
        assert scraped["asrpool_router_sessions_open"] == 0
        assert scraped["asrpool_router_relayed_messages_total"] >= len(streams)
        del pod
    finally:
        code = await asyncio.to_thread(proc.terminate)
    assert code == 0
    assert not [w for w in workers if Path(f"/proc/{w}").exists()]


# A binary frame header that declares 2^62 payload bytes (a hostile pod's), unmasked.
HUGE = bytes([0x82, 127]) + (1 << 62).to_bytes(8, "big")


async def _flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: FakePod) -> None:
    """Stream the declared payload until the router hangs up."""
    chunk = b"x" * 65536
    with contextlib.suppress(OSError):
        for _ in range(2000):  # 128 MiB at most
            writer.write(chunk)
            await writer.drain()


async def _healthy_while(router: support.RouterProcess, redis: aioredis.Redis, pool: str,
                         attack: Awaitable[None]) -> None:
    """A stream on the same router answers while ``attack`` runs, and after."""
    healthy_pod = await start(redis, pool, _echo_words)
    healthy = await connect(router, pool)
    await healthy.send(AUDIO)
    assert msgpack.unpackb(await asyncio.wait_for(healthy.recv(), 10))["type"] == "Word"
    await attack
    await healthy.send(AUDIO)
    assert msgpack.unpackb(await asyncio.wait_for(healthy.recv(), 10))["type"] == "Word"
    await healthy.close()
    await asyncio.wait_for(healthy_pod.done.wait(), 10)


async def test_a_pod_whose_first_frame_declares_a_huge_message_is_refused_from_its_header(
    router: support.RouterProcess, redis: aioredis.Redis
) -> None:
    """Its header is read, refused, and the link dropped: the router buffers none of the
    flood; the client hears busy (no other pod in that pool), a neighbour streams on."""
    hostile = await start(redis, "relay-huge-first", _flood, first=HUGE)

    async def attack() -> None:
        async with ws_client.connect(f"{router.ws_url}?pool=relay-huge-first",
                                     max_size=None, proxy=None) as ws:
            error = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 10))
        assert (error["type"], error["code"]) == ("Error", "busy")
        await asyncio.wait_for(hostile.done.wait(), 10)

    await _healthy_while(router, redis, "relay-huge-first-neighbour", attack())
    assert "first frame declares 4611686018427387904 bytes, over the" in router.log()


async def test_a_pod_that_declares_a_huge_frame_mid_stream_is_dropped_as_lost(
    router: support.RouterProcess, redis: aioredis.Redis
) -> None:
    async def huge_after_audio(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                               pod: FakePod) -> None:
        await reader.read(1)  # the client's first audio
        writer.write(WORD + HUGE)
        await _flood(reader, writer, pod)

    hostile = await start(redis, "relay-huge-frame", huge_after_audio)

    async def attack() -> None:
        ws = await connect(router, "relay-huge-frame")
        await ws.send(AUDIO)
        assert msgpack.unpackb(await asyncio.wait_for(ws.recv(), 10))["type"] == "Word"
        error = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 10))
        assert (error["type"], error["code"]) == ("Error", "pod_lost")
        with pytest.raises(websockets.ConnectionClosed) as caught:
            await asyncio.wait_for(ws.recv(), 10)
        assert caught.value.rcvd is not None and caught.value.rcvd.code == 1011
        await asyncio.wait_for(hostile.done.wait(), 10)
        await slot_freed(redis, "relay-huge-frame")

    await _healthy_while(router, redis, "relay-huge-frame-neighbour", attack())
    assert "the pod sent a message of 4611686018427387904 bytes, over the" in router.log()


async def test_a_pod_that_masks_its_frames_is_dropped_as_lost(
    router: support.RouterProcess, redis: aioredis.Redis
) -> None:
    async def masked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     pod: FakePod) -> None:
        await reader.read(1)
        writer.write(frames.frame(frames.BINARY, b"word", mask=b"abcd"))
        await pod.read_until_eof(reader)

    await start(redis, "relay-masked", masked)
    ws = await connect(router, "relay-masked")
    await ws.send(AUDIO)
    error = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 10))
    assert (error["type"], error["code"]) == ("Error", "pod_lost")
    await slot_freed(redis, "relay-masked")
    assert "the pod sent a frame no server may send" in router.log()


async def test_a_forged_heartbeat_is_skipped_and_counted_never_a_500(
    router: support.RouterProcess, redis: aioredis.Redis
) -> None:
    """A record with ``total_slots=x`` beside a real pod: /api/pools and /api/modules_info
    answer and name it, admission goes to the real pod, the router's gauge counts it."""
    pool = "relay-forged"
    pod = await start(redis, pool, _echo_words)
    await redis.hset(registry.pod_key(pool, "forged"), mapping={
        "pod_id": "forged", "pool": pool, "address": "127.0.0.1:1", "total_slots": "x",
        "free_slots": "8", "draining": "0", "model": "m"})
    await redis.zadd(registry.pool_pods_key(pool),
                     {"forged": await registry.redis_now_ms(redis) + 60_000})
    for path in ("/api/pools", "/api/modules_info"):
        status, body = support.http_get(router.url + path)
        assert status == 200, body
    status, body = support.http_get(router.url + "/api/pools")
    view = json.loads(body)["pools"][pool]
    assert [p["pod_id"] for p in view["pods"]] == [f"{pool}-pod"]
    assert view["malformed_heartbeats"] == [
        "forged: total_slots='x' is not a count from 0 to 1048576"]
    ws = await connect(router, pool)  # admitted to the real pod
    await ws.send(AUDIO)
    assert msgpack.unpackb(await asyncio.wait_for(ws.recv(), 10))["type"] == "Word"
    await ws.close()
    await asyncio.wait_for(pod.done.wait(), 10)
    support.wait_until(
        lambda: f'asrpool_router_malformed_heartbeats{{pool="{pool}"}} 1.0'
        in support.http_get(router.url + "/metrics")[1].decode(), 10, "the gauge")


async def test_a_flooded_lease_set_costs_every_router_a_bounded_read_and_no_neighbour_its_pod(
    router: support.RouterProcess, redis: aioredis.Redis
) -> None:
    """Whoever writes a pool's lease set (its pods' Redis user) puts 10,000 live entries
    in it: the router reads the latest 4,096 of them per pass and says how many it left
    (/api/pools, a gauge), and a neighbour pool's streams are admitted as ever."""
    flooded, neighbour = "relay-flooded", "relay-neighbour"
    pod = await start(redis, neighbour, _echo_words)
    until = await registry.redis_now_ms(redis) + 120_000
    await redis.zadd(registry.pool_pods_key(flooded),
                     {f"fake-{i}": until for i in range(10_000)})
    await redis.sadd(registry.POOLS_KEY, flooded)
    read_before = await _hgetall_calls(redis)
    await asyncio.sleep(2.5)  # two passes of the router's pool watch, or three
    read = await _hgetall_calls(redis) - read_before
    assert read <= 3 * (registry.MAX_PODS_READ + 50), read
    status, body = support.http_get(router.url + "/api/pools")
    assert status == 200, body
    assert json.loads(body)["pools"][flooded]["unread_pods"] == 10_000 - registry.MAX_PODS_READ
    support.wait_until(
        lambda: f'asrpool_router_unread_pods{{pool="{flooded}"}} 5904.0'
        in support.http_get(router.url + "/metrics")[1].decode(), 10, "the gauge")
    ws = await connect(router, neighbour)
    await ws.send(AUDIO)
    assert msgpack.unpackb(await asyncio.wait_for(ws.recv(), 10))["type"] == "Word"
    await ws.close()
    await asyncio.wait_for(pod.done.wait(), 10)
    await redis.delete(registry.pool_pods_key(flooded))
    await redis.srem(registry.POOLS_KEY, flooded)


async def _hgetall_calls(redis: aioredis.Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))
