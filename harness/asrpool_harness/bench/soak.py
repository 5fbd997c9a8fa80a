"""Soak: every hostile-client attack against a real pod and a real router, with a
real-time neighbour stream measured throughout. Writes ``bench/results/soak.json``.

    asrpool bench soak [--fuzz-frames 100000] [--half-open 200] [--slots 4]

The local platform (Redis, one ``asrpool serve --model tiny`` pod, one router, default
settings) runs on loopback. Each attack runs against the pod directly and then through
the router, while a neighbour on the same pod sends 80 ms of audio every 80 ms through
the router; its latency is the time from sending a frame to receiving that frame's
``Step`` (queueing, the model step and the relay; the same in every phase, so compare
with the ``baseline`` phase). Attacks (``harness/asrpool_harness/bench/attacks.py``):

- ``non_reader``: clients with the smallest receive buffer that send audio as fast as
  they can and read nothing (cut by the send deadline);
- ``header_flood``: request heads that never end (8 MiB each; HTTP 431), with the
  growth of the target's resident memory;
- ``query_flood``: 32 MiB query strings (HTTP 431), with the target's CPU seconds;
- ``half_open``: connections that send half a request head and wait (HTTP 408 at the
  handshake deadline): how many are still held after it;
- ``tiny_frames`` and ``markers``: one client sending 1-sample ``Audio`` or ``Marker``
  frames as fast as it can (``Error`` too_many_messages, too_many_markers);
- ``churn``: websocket streams opened and closed at once, as fast as ``--churn-workers``
  connections at a time go, for ``--churn-seconds``: how many were opened, refused busy
  (upgrade, ``Error`` busy, close) or refused over the new-streams rate (HTTP 429
  before the upgrade), and the rate they came at;
- ``fuzz``: random and mutated MessagePack frames (random bytes, random MessagePack
  trees, valid messages with flipped, cut, inserted bytes or swapped fields), one
  connection after another: each frame the pod's decoder refuses must end its stream
  with an ``Error`` (``unrefused`` counts those that did not);
- ``upload_bomb``, ``opus_bomb``, ``abandoned_upload``, ``slow_body``: a little input
  that would cost a lot (``upload_attacks``): Opus declaring hours, posted or in one
  websocket message; uploads whose clients leave; bodies that stall or trickle.

Every phase also reports how far the pod's and the router's resident memory rose above
where the phase began (``memory_growth_mib``, sampled every 100 ms).

Between phases the soak waits until the neighbour is back to its baseline (its last
frames answered within twice the baseline's p99, nothing older waiting): a phase's
figures are its own, not the backlog of the phase before (``settle_s`` says how long
that took).

Afterwards every slot must be free and every router session gone: ``slots_leaked``
and ``sessions_leaked`` (both must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import platform
import random
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import websockets
from websockets.asyncio import client as ws_client

from asrpool.bench import stats
from asrpool.client import local
from asrpool.common import processes, protocol, redis_clients
from asrpool.router import frames, keys
from asrpool_harness.bench import attacks, upload_attacks

FRAME_S = protocol.FRAME_SIZE / protocol.SAMPLE_RATE
ATTACKS = ("non_reader", "header_flood", "query_flood", "half_open", "tiny_frames", "markers",
           "churn", "fuzz", "upload_bomb", "opus_bomb", "abandoned_upload", "slow_body")
AUDIO = msgpack.packb({"type": "Audio", "pcm": [0.0] * protocol.FRAME_SIZE},
                      use_single_float=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asrpool bench soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--slots", type=int, default=8, help="of the one pod")
    parser.add_argument("--fuzz-frames", type=int, default=100_000, help="half per target")
    parser.add_argument("--fuzz-workers", type=int, default=6, help="connections at once")
    parser.add_argument("--half-open", type=int, default=200)
    parser.add_argument("--header-floods", type=int, default=20)
    parser.add_argument("--head-mib", type=int, default=8, help="per unfinished head")
    parser.add_argument("--query-floods", type=int, default=5)
    parser.add_argument("--non-readers", type=int, default=2)
    parser.add_argument("--non-reader-seconds", type=float, default=60.0,
                        help="how long each would send unless cut")
    parser.add_argument("--flood-messages", type=int, default=20_000)
    parser.add_argument("--churn-workers", type=int, default=6, help="connections at once")
    parser.add_argument("--churn-seconds", type=float, default=20.0)
    parser.add_argument("--new-streams-per-second", type=float, default=None,
                        help="the pod's and router's (default: theirs)")
    parser.add_argument("--settle-seconds", type=float, default=60.0,
                        help="longest wait for the neighbour's baseline between phases")
    parser.add_argument("--baseline-seconds", type=float, default=10.0)
    parser.add_argument("--handshake-timeout-seconds", type=float, default=10.0,
                        help="the pod's and router's (their default)")
    parser.add_argument("--send-timeout-seconds", type=float, default=5.0,
                        help="the pod's and router's (their default)")
    parser.add_argument("--attacks", default=",".join(ATTACKS),
                        help="comma-separated, of: " + ", ".join(ATTACKS))
    upload_attacks.add_arguments(parser)
    parser.add_argument("--opus-workers", type=int, default=None,
                        help="the pod's Opus lanes (asrpool serve --opus-workers)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--name", default="soak", help="of the JSON written in --out")
    return parser.parse_args(argv)


# The targets


class Target:
    def __init__(self, name: str, address: tuple[str, int], pid: int) -> None:
        self.name, self.address, self.pid = name, address, pid

    @property
    def ws_url(self) -> str:
        return f"ws://{self.address[0]}:{self.address[1]}{protocol.STREAMING_PATH}"


# The neighbour


class Neighbour:
    """A real-time stream through the router: a frame every 80 ms, the latency of
    each frame's Step, collected per phase."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sent: dict[int, float] = {}
        self.latencies: list[float] = []
        self.errors: list[dict[str, Any]] = []

    def take(self) -> list[float]:
        taken, self.latencies = self.latencies, []
        return taken

    def settled(self, threshold: float, frames: int = 10) -> bool:
        """Its last ``frames`` frames were answered within ``threshold`` and no frame
        sent longer ago is still waiting (no backlog left on the pod)."""
        recent = self.latencies[-frames:]
        now = time.monotonic()
        waiting = [now - sent for sent in self.sent.values()]
        return (len(recent) == frames and max(recent) <= threshold
                and max(waiting, default=0.0) <= threshold)

    async def run(self, stop: asyncio.Event) -> None:
        async with ws_client.connect(self.url, max_size=None, compression=None) as ws:
            await ws.recv()  # Ready
            receiver = asyncio.create_task(self._receive(ws))
            loop = asyncio.get_running_loop()
            started, index = loop.time(), 0
            while not stop.is_set() and not receiver.done():
                self.sent[index] = time.monotonic()
                await ws.send(AUDIO)
                index += 1
                await asyncio.sleep(max(0.0, started + index * FRAME_S - loop.time()))
            receiver.cancel()

    async def _receive(self, ws: ws_client.ClientConnection) -> None:
        async for data in ws:
            message = msgpack.unpackb(data)
            if message.get("type") == "Step":  # step_idx k is frame k - 1's (counted from 1)
                sent = self.sent.pop(message["step_idx"] - 1, None)
                if sent is not None:
                    self.latencies.append(time.monotonic() - sent)
            elif message.get("type") == "Error":
                self.errors.append(message)


# Attacks on raw sockets (threads)


def non_readers(target: Target, opts: argparse.Namespace) -> dict[str, Any]:
    results: list[attacks.Streamed] = []
    threads = [threading.Thread(target=lambda: results.append(attacks.stream_without_reading(
        target.address, {}, opts.non_reader_seconds))) for _ in range(opts.non_readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"tried": opts.non_readers, "cut": sum(r.cut for r in results),
            "connections_held": sum(not r.cut for r in results),
            "cut_after_s": [round(r.seconds, 1) for r in results if r.cut],
            "frames_sent": [r.frames_sent for r in results], "survived": _alive(target)}


def header_floods(target: Target, opts: argparse.Namespace) -> dict[str, Any]:
    head = (b"GET /api/asr-streaming HTTP/1.1\r\nHost: x\r\nX-Filler: "
            + b"a" * (opts.head_mib << 20))
    rss = processes.rss_bytes(target.pid)
    statuses = attacks.in_threads(opts.header_floods, lambda: attacks.status_of(
        attacks.exchange(target.address, head, 30)))
    return {"tried": opts.header_floods, "bytes_each": len(head),
            "statuses": attacks.counted(statuses), "survived": _alive(target),
            "rss_growth_mib": round((processes.rss_bytes(target.pid) - rss) / 2**20, 1)}


def query_floods(target: Target, opts: argparse.Namespace) -> dict[str, Any]:
    request = (b"GET /api/asr-streaming?auth_id=" + b"q" * (32 << 20) + b" HTTP/1.1\r\n"
               b"Host: x\r\n\r\n")
    cpu = processes.cpu_seconds(target.pid)
    statuses = [attacks.status_of(attacks.exchange(target.address, request, 30))
                for _ in range(opts.query_floods)]
    used = processes.cpu_seconds(target.pid) - cpu
    return {"tried": opts.query_floods, "statuses": attacks.counted(statuses),
            "survived": _alive(target),
            "target_cpu_s_per_flood": round(used / max(1, opts.query_floods), 3)}


def half_open(target: Target, opts: argparse.Namespace) -> dict[str, Any]:
    socks = []
    for _ in range(opts.half_open):
        with contextlib.suppress(OSError):
            sock = attacks.connect(target.address)
            sock.sendall(b"GET /api/asr-streaming HTTP/1.1\r\nHost: x\r\n")
            socks.append(sock)
    time.sleep(opts.handshake_timeout_seconds + 2.0)  # the handshake deadline and some
    held, statuses = 0, []
    for sock in socks:
        sock.setblocking(False)
        try:
            answer = sock.recv(1 << 16)
            statuses.append(attacks.status_of(answer))
        except BlockingIOError:
            held += 1  # nothing answered and not closed
        except OSError:
            statuses.append(None)
        sock.close()
    return {"tried": len(socks), "connections_held": held, "statuses": attacks.counted(statuses),
            "after_s": opts.handshake_timeout_seconds + 2.0, "survived": _alive(target)}


def _alive(target: Target) -> bool:
    host, port = target.address
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


# Attacks over websockets (asyncio)


async def flood(target: Target, frame: bytes, count: int) -> dict[str, Any]:
    sent = 0
    async with ws_client.connect(target.ws_url, max_size=None, compression=None) as ws:
        with contextlib.suppress(websockets.ConnectionClosed):
            for _ in range(count):
                await ws.send(frame)
                sent += 1
        got = []
        with contextlib.suppress(websockets.ConnectionClosed, TimeoutError):
            while True:
                got.append(msgpack.unpackb(await asyncio.wait_for(ws.recv(), 30)))
    codes = [m.get("code") for m in got if m.get("type") == "Error"]
    return {"tried": sent, "error_codes": codes, "close_code": ws.close_code,
            "survived": codes != []}


def fuzz_frames(rng: random.Random, count: int) -> Iterator[bytes]:
    for _ in range(count):
        kind = rng.random()
        if kind < 0.2:
            yield rng.randbytes(rng.randint(0, 64))
        elif kind < 0.5:
            yield msgpack.packb(_tree(rng, 3), use_bin_type=rng.random() < 0.5)
        else:
            yield _mutated(rng, _valid(rng))


def _valid(rng: random.Random) -> bytes:
    choice = rng.randrange(4)
    if choice == 0:
        pcm = np.asarray([rng.uniform(-1, 1) for _ in range(rng.randint(0, 64))], np.float32)
        audio: bytes = msgpack.packb({"type": "Audio", "pcm": pcm.tolist()},
                                     use_single_float=True)
        return audio
    if choice == 1:
        marker: bytes = msgpack.packb({"type": "Marker", "id": rng.randint(-2**63, 2**63 - 1)})
        return marker
    if choice == 2:
        init: bytes = msgpack.packb({"type": "Init"})
        return init
    opus: bytes = msgpack.packb({"type": "OggOpus", "data": b"OggS" + rng.randbytes(40)},
                                use_bin_type=True)
    return opus


def _mutated(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        how = rng.randrange(4)
        if how == 0 and out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        elif how == 1 and out:
            del out[rng.randrange(len(out)):]
        elif how == 2:
            at = rng.randrange(len(out) + 1)
            out[at:at] = rng.randbytes(rng.randint(1, 8))
        else:
            out = bytearray(data.replace(b"Audio", b"Marke").replace(b"pcm", b"id\xa1")
                            if rng.random() < 0.5 else data[::-1])
    return bytes(out)


def _tree(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(9 if depth else 6)
    if kind == 0:
        return rng.choice([0, -1, 2**63 - 1, -(2**63), 2**64 - 1, rng.randint(-9, 9)])
    if kind == 1:
        return rng.choice([0.0, float("nan"), float("inf"), 3e38, -1e308, rng.random()])
    if kind == 2:
        return rng.choice(["Audio", "Marker", "Init", "OggOpus", "", "Ready", "é" * 3])
    if kind == 3:
        return rng.randbytes(rng.randint(0, 16))
    if kind == 4:
        return None
    if kind == 5:
        return rng.random() < 0.5
    if kind == 6:
        return [_tree(rng, depth - 1) for _ in range(rng.randint(0, 6))]
    fields: dict[Any, Any] = {"type": _tree(rng, 0)}
    for key in rng.sample(["pcm", "id", "data", "type", "extra", 1], rng.randint(0, 3)):
        fields[key] = _tree(rng, depth - 1)
    return fields


def refused_locally(frame: bytes) -> bool:
    """Whether the pod's decoder refuses the frame (its stream must then end)."""
    try:
        protocol.decode_client(frame)
    except protocol.ProtocolError:
        return True
    return False


async def fuzz(target: Target, frames: list[bytes], workers: int) -> dict[str, Any]:
    """One raw-socket connection after another, each fed frames until one that the
    pod's decoder refuses: that one must end the stream with an Error and a close."""
    codes: collections.Counter[str] = collections.Counter()
    tally = {"tried": 0, "connections": 0, "unrefused": 0, "busy_waits": 0, "rate_limited": 0}
    queue: collections.deque[bytes] = collections.deque(frames)

    async def worker() -> None:
        while queue:
            try:
                reader, writer = await asyncio.open_connection(*target.address)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            try:
                answer = await _handshake(reader, writer)
                if answer != "ready":  # every slot taken, or over the new-streams rate
                    tally["rate_limited" if answer == "http_429" else "busy_waits"] += 1
                    await asyncio.sleep(0.02)
                    continue
                tally["connections"] += 1
                await _fuzz_connection(reader, writer, queue, tally, codes)
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                codes["connection_lost"] += 1
            finally:
                writer.close()

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(workers)))
    seconds = time.monotonic() - started
    return tally | {"error_codes": dict(codes), "seconds": round(seconds, 1),
                    "survived": _alive(target),
                    "frames_per_s": round(tally["tried"] / seconds, 1)}


async def churn(target: Target, opts: argparse.Namespace) -> dict[str, Any]:
    """Open a stream, close it as soon as the server answers, again, ``--churn-workers``
    connections at a time for ``--churn-seconds``: what each attempt was answered."""
    outcomes: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + opts.churn_seconds

    async def worker() -> None:
        while time.monotonic() < deadline:
            try:
                outcomes[await _churn_once(target)] += 1
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                outcomes["connection_lost"] += 1

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(opts.churn_workers)))
    seconds = time.monotonic() - started
    tried = sum(outcomes.values())
    return {"tried": tried, "outcomes": dict(outcomes), "seconds": round(seconds, 1),
            "attempts_per_s": round(tried / seconds, 1),
            "opened_per_s": round(outcomes["ready"] / seconds, 1), "survived": _alive(target)}


async def _churn_once(target: Target) -> str:
    """One stream opened and closed at once: ``ready``, the ``Error`` code it was
    refused with, or ``http_<status>`` for a refusal before the upgrade."""
    reader, writer = await asyncio.open_connection(*target.address)
    try:
        answer = await _handshake(reader, writer)
        if not answer.startswith("http_"):
            writer.write(frames.close_frame(protocol.CloseCode.NORMAL, mask=os.urandom(4)))
            await _until_closed(reader)
        return answer
    finally:
        writer.close()


async def _handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
    """Upgrade and read the first message: ``ready``, ``http_<status>`` (no upgrade) or
    the code of the ``Error`` it was."""
    writer.write(attacks.upgrade_request())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status = attacks.status_of(head)
    if status != 101:
        return f"http_{status}"
    _, payload = await _read_frame(reader)
    message = msgpack.unpackb(payload)
    return "ready" if message.get("type") == "Ready" else str(message.get("code"))


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(opcode, payload) of the next frame from a server (never masked)."""
    first, second = await asyncio.wait_for(reader.readexactly(2), 10)
    size = second & 0x7F
    if size == 126:
        size = int.from_bytes(await reader.readexactly(2), "big")
    elif size == 127:
        size = int.from_bytes(await reader.readexactly(8), "big")
    return first & 0x0F, await reader.readexactly(size)


async def _fuzz_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           queue: collections.deque[bytes], tally: dict[str, int],
                           codes: collections.Counter[str]) -> None:
    while queue:
        frame = queue.popleft()
        tally["tried"] += 1
        writer.write(attacks.masked(frame))
        if refused_locally(frame):
            closed, errors = await _until_closed(reader)
            codes.update(errors)
            tally["unrefused"] += not closed
            return


async def _until_closed(reader: asyncio.StreamReader) -> tuple[bool, list[str]]:
    """The Error codes the server sent before its close frame; whether it closed."""
    errors: list[str] = []
    with contextlib.suppress(TimeoutError, asyncio.IncompleteReadError):
        while True:
            opcode, payload = await asyncio.wait_for(_read_frame(reader), 5)
            if opcode == 8:  # close
                return True, errors
            message = msgpack.unpackb(payload) if opcode == 2 else None
            if isinstance(message, dict) and message.get("type") == "Error":
                errors.append(str(message.get("code")))
    return False, errors


# The run


class MemoryWatch:
    """The largest rise of each process's resident memory while it runs (MiB)."""

    def __init__(self, pids: dict[str, int], interval: float = 0.1) -> None:
        self.pids, self.interval = pids, interval
        self.start = {name: processes.rss_bytes(pid) for name, pid in pids.items()}
        self.peak = dict(self.start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], processes.rss_bytes(pid))

    def growth_mib(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {name: round((self.peak[name] - self.start[name]) / 2**20, 1)
                for name in self.pids}


async def phase(name: str, neighbour: Neighbour, attack: Callable[[], Any],
                pids: dict[str, int]) -> dict[str, Any]:
    neighbour.take()
    started = time.monotonic()
    watch = MemoryWatch(pids)
    result = await attack()
    growth = watch.growth_mib()
    print(f"{name}: {json.dumps(result)}", flush=True)
    return {"attack": name, "seconds": round(time.monotonic() - started, 1), "result": result,
            "neighbour": stats.percentiles(neighbour.take(), digits=2),
            "memory_growth_mib": growth}


async def settle(neighbour: Neighbour, threshold: float, timeout: float) -> float:
    """Wait until the neighbour is back to its baseline (at most ``timeout``); how long."""
    started = time.monotonic()
    while not neighbour.settled(threshold) and time.monotonic() - started < timeout:
        await asyncio.sleep(0.2)
    return round(time.monotonic() - started, 1)


def attacks_of(target: Target, pod: Target, opts: argparse.Namespace, rng: random.Random
               ) -> list[tuple[str, Callable[[], Any]]]:
    one_sample = msgpack.packb({"type": "Audio", "pcm": [0.0]}, use_single_float=True)
    marker = msgpack.packb({"type": "Marker", "id": 1})
    frames = list(fuzz_frames(rng, opts.fuzz_frames // 2))
    chosen = set(opts.attacks.split(","))
    bodies = upload_attacks.Bodies.build(opts)
    return [(name, attack) for name, attack in [
        ("non_reader", lambda: asyncio.to_thread(non_readers, target, opts)),
        ("header_flood", lambda: asyncio.to_thread(header_floods, target, opts)),
        ("query_flood", lambda: asyncio.to_thread(query_floods, target, opts)),
        ("half_open", lambda: asyncio.to_thread(half_open, target, opts)),
        ("tiny_frames", lambda: flood(target, one_sample, opts.flood_messages)),
        ("markers", lambda: flood(target, marker, opts.flood_messages)),
        ("churn", lambda: churn(target, opts)),
        ("fuzz", lambda: fuzz(target, frames, opts.fuzz_workers)),
        ("upload_bomb", lambda: asyncio.to_thread(
            upload_attacks.upload_bombs, target.address, opts, bodies)),
        ("opus_bomb", lambda: upload_attacks.opus_stream_bomb(target.ws_url, opts, bodies)),
        ("abandoned_upload", lambda: asyncio.to_thread(
            upload_attacks.abandoned_uploads, target.address, opts, bodies,
            lambda: used_slots(pod))),
        ("slow_body", lambda: asyncio.to_thread(upload_attacks.slow_bodies, target.address, opts)),
    ] if name in chosen]


def used_slots(pod: Target) -> int:
    info = json.loads(_get(f"http://{pod.address[0]}:{pod.address[1]}/api/modules_info"))
    return int(info[0]["used_slots"])


def wait_used(pod: Target, most: int, timeout: float = 40.0) -> None:
    """Until at most ``most`` slots are used (the last attack's streams have ended)."""
    deadline = time.monotonic() + timeout
    while used_slots(pod) > most and time.monotonic() < deadline:
        time.sleep(0.1)


def leaks(plat: local.LocalPlatform, pod: Target, timeout: float = 40.0) -> dict[str, int]:
    client = redis_clients.connect_sync(plat.redis_url, local.REDIS_TIMEOUT_SECONDS,
                                        password=plat.redis_password, decode_responses=True)
    deadline = time.monotonic() + timeout
    while True:
        used = used_slots(pod)
        sessions = [k for k in client.scan_iter(keys.session("*", "*")) if not k.endswith(":ended")]
        if (not used and not sessions) or time.monotonic() > deadline:
            client.close()
            return {"slots_leaked": used, "sessions_leaked": len(sessions)}
        time.sleep(0.5)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


async def soak(plat: local.LocalPlatform, targets: list[Target],
               opts: argparse.Namespace) -> dict[str, Any]:
    neighbour = Neighbour(plat.router_url + protocol.STREAMING_PATH)
    stop = asyncio.Event()
    running = asyncio.create_task(neighbour.run(stop))
    pids = {target.name: target.pid for target in targets}
    phases = [await phase("baseline", neighbour,
                          lambda: asyncio.sleep(opts.baseline_seconds, {}), pids)]
    threshold = max(0.2, 2 * phases[0]["neighbour"].get("p99_ms", 100) / 1e3)
    rng = random.Random(opts.seed)
    for target in targets:
        for name, attack in attacks_of(target, targets[0], opts, rng):
            await asyncio.to_thread(wait_used, targets[0], 1)  # the neighbour's slot alone
            settled = await settle(neighbour, threshold, opts.settle_seconds)
            phases.append({"target": target.name, "settle_s": settled} | await phase(
                f"{name}@{target.name}", neighbour, attack, pids))
    stop.set()
    await running
    return {"phases": phases, "neighbour_errors": neighbour.errors,
            "bad_inputs_tried": sum(p["result"].get("tried", 0) for p in phases),
            "floods_survived": sum(bool(p["result"].get("survived")) for p in phases),
            "floods": len(phases) - 1,
            "connections_held": sum(p["result"].get("connections_held", 0) for p in phases)}


def targets_of(plat: local.LocalPlatform) -> list[Target]:
    beat = asyncio.run(plat.snapshot())[0]
    host, port = beat.address.rsplit(":", 1)
    pids = {c.name: c.process.pid for c in plat.children}
    return [Target("pod", (host, int(port)), pids["pod-0"]),
            Target("router", ("127.0.0.1", plat.port), pids["router"])]


def platform_environment(opts: argparse.Namespace
                         ) -> contextlib.AbstractContextManager[None]:
    """The pod's and router's deadlines (and the pod's Opus lanes), as the environment
    their processes inherit (restored afterwards)."""
    values = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for name, value in (("HANDSHAKE_TIMEOUT_SECONDS", opts.handshake_timeout_seconds),
                        ("HANDSHAKE_TIMEOUT_S", opts.handshake_timeout_seconds),
                        ("SEND_TIMEOUT_SECONDS", opts.send_timeout_seconds),
                        ("SEND_TIMEOUT_S", opts.send_timeout_seconds),
                        ("BODY_TIMEOUT_SECONDS", opts.body_timeout_seconds),
                        ("NEW_STREAMS_PER_SECOND", opts.new_streams_per_second),
                        ("OPUS_WORKERS", opts.opus_workers)):
        if value is not None:
            values[f"ASRPOOL_{name}"] = str(value)
    return processes.inherited_environment(values)


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    started = time.monotonic()
    with platform_environment(opts), \
            local.LocalPlatform(1, opts.slots, opts.model, processes.free_port()) as plat:
        targets = targets_of(plat)
        result = asyncio.run(soak(plat, targets, opts))
        result |= leaks(plat, targets[0])
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "settings": vars(opts), "seconds": round(time.monotonic() - started, 1)} | result
    path = Path(opts.out) / f"{opts.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"slots leaked {result['slots_leaked']}, sessions leaked "
          f"{result['sessions_leaked']}; wrote {path}")
    return 0 if result["slots_leaked"] == result["sessions_leaked"] == 0 else 1
