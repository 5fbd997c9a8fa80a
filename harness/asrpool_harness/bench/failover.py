"""A Redis failover under live streams and admission churn. Writes JSON to
``bench/results/``.

    asrpool bench failover --streams 100 --seconds 12

The platform on loopback with its Redis run by Sentinel (a primary, two replicas, three
sentinels of quorum two that promote a replica a second after the primary stops
answering: ``asrpool_harness.redis_servers``), ``--pods`` ``tiny`` pods of ``--slots``
slots each, listed as members, and one router (``pack``). ``--streams`` clients stream
noise at real time for ``--seconds``, then a marker (those of ``bench nocuts``); beside
them a new stream is opened every ``--churn-interval`` seconds and closed as soon as it
is answered. ``--kill-at`` seconds after the streams start, the primary is SIGKILLed.
The pods do not refuse new streams when behind real time (``--overload-seconds 0``: a
pod's ``busy`` then says it had no free slot, whatever else shares this machine's cores).

Reported: each long stream kept (its marker back, no ``Error``, no close) or cut, and the
longest gap between two messages a kept stream received from 2 s before the kill; each
pod's slots held, sampled from the registry every ``--sample-interval`` s (the larger of
what its heartbeat says it uses and the sessions the routers count on it, as the
admission script reckons them) against its slots, the ``busy`` answers the pods gave (a
pod sent more streams than it has slots), and when each pod would take no new stream
(``not_admitting``: its heartbeat lapsed, draining or full; times from the kill); the
churn's attempts, admitted and refused by code (a router's ``busy``: no pod with room in
its view), and of those started after the kill the refusals' window (the first to the
last answered, all codes and each code's own) and the time from the kill to the first
admission. Clients all come from one address here, so the router's limit of new streams
per address is off. Exit 1 if a stream was cut, a pod was over its slots or answered
``busy``, or no new stream was admitted within 10 s of the kill.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import functools
import itertools
import os
import platform
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import msgpack
import redis
import redis.asyncio as aioredis
import websockets
from websockets.asyncio import client as ws_client

from asrpool.bench import reports
from asrpool.common import processes, protocol, redis_clients, registry
from asrpool.router import keys
from asrpool_harness.bench import nocuts
from asrpool_harness.redis_servers import SENTINEL_SERVICE, RedisSentinelServers

HOST = "127.0.0.1"
POOL = registry.DEFAULT_POOL
POLICY = "pack"
# The bound: new streams are admitted again within this long of the kill.
ADMITTED_AGAIN_WITHIN_S = 10.0
# The churn goes on after the streams end until a stream is admitted, at most this long
# after the kill.
CHURN_BOUND_S = 30.0
ANSWER_TIMEOUT_S = 30.0
REDIS_TIMEOUT_S = 0.5
BUSY_METRIC = f'asr_errors_total{{code="{protocol.ErrorCode.BUSY}"}}'


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asrpool bench failover", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=100, help="long real-time streams")
    parser.add_argument("--seconds", type=float, default=12.0, help="audio per long stream")
    parser.add_argument("--pods", type=int, default=2)
    parser.add_argument("--slots", type=int, default=60, help="slots per pod")
    parser.add_argument("--kill-at", type=float, default=4.0,
                        help="seconds after the streams start that the primary is SIGKILLed")
    parser.add_argument("--churn-interval", type=float, default=0.2,
                        help="seconds between two new short streams")
    parser.add_argument("--sample-interval", type=float, default=0.1,
                        help="seconds between two reads of the registry's slots")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    if args.streams < 1 or args.pods < 1 or args.slots < 1:
        parser.error("--streams, --pods and --slots must be at least 1")
    if not 0 < args.kill_at < args.seconds:
        parser.error("--kill-at must fall within the streams' --seconds")
    return args


class Platform:
    """Redis run by Sentinel, ``pods`` tiny pods listed as members and one router, on
    loopback; everything stopped and its files removed at the end."""

    def __init__(self, pods: int, slots: int) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="asrpool-failover-"))
        self.redis = RedisSentinelServers(self.workdir / "redis")
        self.pod_ids = [f"pod-{index}" for index in range(pods)]
        self.pod_ports = [processes.free_port() for _ in range(pods)]
        self.slots = slots
        self.router_port = processes.free_port()
        self.children: list[processes.Child] = []

    @property
    def stream_url(self) -> str:
        return f"ws://{HOST}:{self.router_port}{protocol.STREAMING_PATH}"

    def start(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        self.redis.workdir.mkdir(parents=True)
        self.redis.start()
        for pod_id, port in zip(self.pod_ids, self.pod_ports, strict=True):
            self._spawn(pod_id, [
                "serve", "--model", "tiny", "--batch-size", str(self.slots), "--host", HOST,
                "--port", str(port), "--redis-url", self.redis.url, "--pod-id", pod_id,
                "--advertise-address", f"{HOST}:{port}", "--drain-grace-seconds", "0",
                "--torch-threads", "1", "--log-level", "warning",
                # a pod behind real time refuses new streams busy too: off, so that a
                # pod's busy says it had no free slot (the streams share these cores)
                "--overload-seconds", "0"])
        asyncio.run(self._list_pods())
        self._spawn("router", [
            "route", "--redis-url", self.redis.url, "--host", HOST,
            "--port", str(self.router_port), "--policy", POLICY, "--workers", "1",
            "--members-required", "--drain-grace-seconds", "0",
            "--new-streams-per-second", "0", "--log-level", "warning"])
        for port in self.pod_ports:
            self._wait(functools.partial(_http_ok, port, "/readyz"), deadline, "a pod")
        self._wait(lambda: _http_ok(self.router_port, "/readyz"), deadline, "the router")
        self._wait(lambda: asyncio.run(self._heartbeats()) == len(self.pod_ids), deadline,
                   "the pods' heartbeats")

    def _spawn(self, name: str, args: list[str]) -> None:
        self.children.append(processes.spawn(
            name, [sys.executable, "-m", "asrpool.cli", *args], self.workdir / f"{name}.log",
            env=os.environ))

    def _wait(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        processes.wait_until(ready, max(0.0, deadline - time.monotonic()), what, self.children)

    async def _list_pods(self) -> None:
        """Name the real pods, as the operator does (the router requires it)."""
        client = redis_clients.connect(self.redis.url, 5.0)
        try:
            await registry.publish_members(client, POOL, dict.fromkeys(self.pod_ids, HOST))
        finally:
            await client.aclose()

    async def _heartbeats(self) -> int:
        client = redis_clients.connect(self.redis.url, 5.0)
        try:
            return len(await registry.read_pool(client, POOL))
        finally:
            await client.aclose()

    def busy_answers(self) -> dict[str, float]:
        """Each pod's ``busy`` answers, from its /metrics (0 where it gave none)."""
        out = {}
        for pod_id, port in zip(self.pod_ids, self.pod_ports, strict=True):
            url = f"http://{HOST}:{port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                lines = response.read().decode().splitlines()
            out[pod_id] = next((float(line.split()[1]) for line in lines
                                if line.startswith(BUSY_METRIC + " ")), 0.0)
        return out

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop(15.0)
        self.children.clear()
        self.redis.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def running(pods: int, slots: int) -> Iterator[Platform]:
    platform_ = Platform(pods, slots)
    try:
        platform_.start()
        yield platform_
    finally:
        platform_.stop()


def _http_ok(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class PodSample(NamedTuple):
    slots: int
    used: int  # by its heartbeat
    sessions: int  # the sessions the routers count on it
    closed: str  # why the admission script would give it no new stream ("": it would)


class Registry:
    """Samples of each pod's slots held, read from Redis every ``period`` seconds, and
    when the sentinels named another primary."""

    def __init__(self, platform_: Platform, period: float) -> None:
        self.platform, self.period = platform_, period
        self.samples: list[tuple[float, dict[str, PodSample]]] = []  # (monotonic time, ...)
        self.failed: list[float] = []
        self.killed_port: int | None = None
        self.promoted_at: float | None = None
        self.stop = asyncio.Event()

    async def run(self) -> None:
        client = redis_clients.connect(self.platform.redis.url, REDIS_TIMEOUT_S)
        watching = asyncio.create_task(self._watch_sentinels())
        try:
            while not self.stop.is_set():
                at = time.monotonic()
                try:
                    read = await self._read(client)
                    self.samples.append((time.monotonic(), read))  # when it was read
                except (redis.RedisError, OSError):
                    self.failed.append(at)
                await self._pause(at)
        finally:
            await watching
            await client.aclose()

    async def _pause(self, since: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(),
                                   max(0.0, since + self.period - time.monotonic()))

    async def _watch_sentinels(self) -> None:
        """Once the primary is killed, when the first sentinel names another."""
        sentinels = [redis_clients.connect(f"redis://{HOST}:{port}", REDIS_TIMEOUT_S,
                                           decode_responses=True)
                     for port in self.platform.redis.sentinel_ports]
        try:
            while not self.stop.is_set() and self.promoted_at is None:
                at = time.monotonic()
                if self.killed_port is not None:
                    for sentinel in sentinels:
                        with contextlib.suppress(redis.RedisError, OSError):
                            named: Any = await sentinel.sentinel_get_master_addr_by_name(
                                SENTINEL_SERVICE)
                            if int(named[1]) != self.killed_port:
                                self.promoted_at = time.monotonic()
                                break
                await self._pause(at)
        finally:
            for sentinel in sentinels:
                await sentinel.aclose()

    async def _read(self, client: aioredis.Redis) -> dict[str, PodSample]:
        now_ms = await registry.redis_now_ms(client)
        fields = ("total_slots", "free_slots", "draining", "overloaded")
        async with client.pipeline(transaction=False) as pipe:
            for pod_id in self.platform.pod_ids:
                pipe.hmget(registry.pod_key(POOL, pod_id), *fields)
                # the sessions the admission script counts: scored past now
                pipe.zcount(keys.pod_sessions(POOL, pod_id), f"({now_ms}", "+inf")
                pipe.zscore(registry.pool_pods_key(POOL), pod_id)  # its lease's end
            replies = await pipe.execute()
        out = {}
        for index, pod_id in enumerate(self.platform.pod_ids):
            (total, free, draining, overloaded), sessions, lease = replies[3 * index:3 * index + 3]
            sessions = int(sessions)
            if total is None or free is None or lease is None or float(lease) <= now_ms:
                # no heartbeat (lapsed, or lost with the primary): the sessions still count
                out[pod_id] = PodSample(self.platform.slots, 0, sessions, "lapsed")
                continue
            slots, used = int(total), int(total) - int(free)
            closed = ("draining" if draining in ("1", b"1")
                      else "overloaded" if overloaded in ("1", b"1")
                      else "full" if max(used, sessions) >= slots else "")
            out[pod_id] = PodSample(slots, used, sessions, closed)
        return out

    def summary(self, killed: float, busy: dict[str, float]) -> dict[str, Any]:
        pods = {}
        for pod_id in self.platform.pod_ids:
            seen = [(at, sample[pod_id]) for at, sample in self.samples]
            slots = max((s.slots for _, s in seen), default=self.platform.slots)
            held = max((max(s.used, s.sessions) for _, s in seen), default=0)
            closed: dict[str, list[float]] = collections.defaultdict(list)
            for at, s in seen:
                if s.closed:
                    closed[s.closed].append(at)
            pods[pod_id] = {
                "slots": slots,
                "max_used_by_heartbeat": max((s.used for _, s in seen), default=0),
                "max_sessions_counted": max((s.sessions for _, s in seen), default=0),
                "max_slots_held": held,
                "over_slots": held > slots,
                "busy_answers": int(busy[pod_id]),  # the pod's own refusals
                # the samples in which it would take no new stream, and when (from the kill)
                "not_admitting": {why: {"samples": len(times), **(_window(times, killed) or {})}
                                  for why, times in sorted(closed.items())},
            }
        after = [at for at, _ in self.samples if at > killed]
        return {
            "pods": pods,
            "pods_over_slots": [p for p, v in pods.items() if v["over_slots"]],
            "pod_busy_answers": int(sum(busy.values())),
            "samples": len(self.samples),
            "samples_failed": len(self.failed),
            "registry_read_again_after_s": _after(min(after, default=None), killed),
        }


class Churn:
    """A new stream every ``interval`` seconds, closed as soon as it is answered: each
    attempt's start, answer and outcome (``admitted``, the Error's code, ``http_STATUS``
    for a refused upgrade, or the exception's name)."""

    def __init__(self, url: str, interval: float) -> None:
        self.url, self.interval = url, interval
        self.attempts: list[tuple[float, float, str]] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        pending: set[asyncio.Task[None]] = set()
        started = time.monotonic()
        for tick in itertools.count():
            task = asyncio.create_task(self._attempt())
            pending.add(task)
            task.add_done_callback(pending.discard)
            wake = started + (tick + 1) * self.interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), max(0.0, wake - time.monotonic()))
            if self.stop.is_set():
                break
        await asyncio.gather(*pending)

    async def _attempt(self) -> None:
        at = time.monotonic()
        try:
            async with ws_client.connect(self.url, open_timeout=ANSWER_TIMEOUT_S, proxy=None,
                                         compression=None, max_size=None) as ws:
                first = msgpack.unpackb(await asyncio.wait_for(ws.recv(), ANSWER_TIMEOUT_S))
            outcome = ("admitted" if first.get("type") == "Ready"
                       else str(first.get("code", first.get("type"))))
        except websockets.InvalidStatus as exc:
            outcome = f"http_{exc.response.status_code}"
        except (OSError, TimeoutError, websockets.WebSocketException) as exc:
            outcome = type(exc).__name__
        self.attempts.append((at, time.monotonic(), outcome))

    def admitted_after(self, killed: float) -> float | None:
        """When the first stream started after the kill was admitted (monotonic)."""
        return min((answered for at, answered, outcome in self.attempts
                    if at >= killed and outcome == "admitted"), default=None)

    def summary(self, killed: float) -> dict[str, Any]:
        after = [a for a in self.attempts if a[0] >= killed]
        refused = sorted((answered, outcome) for _, answered, outcome in after
                         if outcome != "admitted")
        return {
            "attempts": len(self.attempts),
            "admitted": sum(outcome == "admitted" for *_, outcome in self.attempts),
            "refused": _codes(self.attempts),
            "after_kill": {
                "attempts": len(after),
                "admitted": sum(outcome == "admitted" for *_, outcome in after),
                "refused": _codes(after),
                # the first refusal to the last, in seconds after the kill: all codes,
                # then each code's own
                "refusal_window": _window([at for at, _ in refused], killed),
                "refusal_window_by_code": {
                    code: _window([at for at, got in refused if got == code], killed)
                    for code in sorted({got for _, got in refused})},
                "admitted_again_after_s": _after(self.admitted_after(killed), killed),
            },
        }


def _window(answered: list[float], killed: float) -> dict[str, float | None] | None:
    if not answered:
        return None
    return {"first_s": _after(answered[0], killed), "last_s": _after(answered[-1], killed),
            "lasted_s": round(answered[-1] - answered[0], 2)}


def _codes(attempts: list[tuple[float, float, str]]) -> dict[str, int]:
    return dict(sorted(collections.Counter(
        outcome for *_, outcome in attempts if outcome != "admitted").items()))


def _after(when: float | None, killed: float) -> float | None:
    return None if when is None else round(when - killed, 2)


async def _failover(platform_: Platform, args: argparse.Namespace) -> dict[str, Any]:
    sampler = Registry(platform_, args.sample_interval)
    churn = Churn(platform_.stream_url, args.churn_interval)
    sampling = asyncio.create_task(sampler.run())
    started = time.monotonic()
    streams = [asyncio.create_task(nocuts._stream(platform_.stream_url, args.seconds, seed))
               for seed in range(args.streams)]
    churning = asyncio.create_task(churn.run())
    await asyncio.sleep(max(0.0, started + args.kill_at - time.monotonic()))
    primary = platform_.redis.primary()
    sampler.killed_port = primary.port
    killed = time.monotonic()
    primary.kill()
    outcomes = list(await asyncio.gather(*streams))
    while churn.admitted_after(killed) is None and time.monotonic() < killed + CHURN_BOUND_S:
        await asyncio.sleep(args.churn_interval)
    churn.stop.set()
    await churning
    sampler.stop.set()
    await sampling
    long_streams = nocuts._summary(outcomes, killed)
    long_streams["streaming_at_kill"] = sum(
        bool(o["arrivals"]) and o["arrivals"][0] < killed for o in outcomes)
    churned = churn.summary(killed)
    return {
        "killed_at_s": round(killed - started, 2),
        "sentinels_promoted_after_s": _after(sampler.promoted_at, killed),
        "long_streams": long_streams,
        "slots": sampler.summary(killed, platform_.busy_answers()),
        "churn": churned,
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    with running(args.pods, args.slots) as platform_:
        measured = asyncio.run(_failover(platform_, args))
    again = measured["churn"]["after_kill"]["admitted_again_after_s"]
    result = {
        "benchmark": "failover",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "parameters": {
            "streams": args.streams, "audio_seconds": args.seconds, "pods": args.pods,
            "slots_per_pod": args.slots, "model": "tiny", "policy": POLICY,
            "pods_refuse_when_behind_real_time": False,
            "kill_at_s": args.kill_at, "churn_interval_s": args.churn_interval,
            "sample_interval_s": args.sample_interval,
            "redis": "sentinel: a primary, 2 replicas, 3 sentinels (quorum 2, down after"
                     " 1000 ms); the primary SIGKILLed"},
        **measured,
        "invariants": {
            "no_stream_cut": measured["long_streams"]["kept"] == args.streams,
            "no_pod_over_slots": not measured["slots"]["pods_over_slots"],
            "no_pod_answered_busy": measured["slots"]["pod_busy_answers"] == 0,
            "admitted_again_within_10_s": again is not None and again <= ADMITTED_AGAIN_WITHIN_S,
        },
        "machine": reports.machine(started),
    }
    reports.write(Path(args.out), f"failover-{args.streams}.json", result)
    return 0 if all(result["invariants"].values()) else 1
