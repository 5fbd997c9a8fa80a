"""Router benchmark: admission latency with routers racing on one Redis, and the latency
the router adds to every message of real-time streams, with its CPU use. Writes JSON
to ``bench/results/``.

    asrpool bench router --routers 4 --streams 100,500,1000 --pods 2 --seconds 10

Admission: ``--routers`` processes, each with its own Redis connection, admit and
release streams in a loop (``--in-flight`` at a time each) against heartbeats of
``--fake-pods`` pods written into a fresh Redis: the time of the ``ADMIT`` script as a
router sees it.

Proxying: for each stream count N, the local platform (Redis, ``--pods`` real
``asrpool serve`` pods with N/pods slots, one router) carries N real-time streams
(80 ms audio messages at 12.5 Hz, a ``Marker`` every second) through the router
and straight to the pods, in alternating phases. The marker round trip (sent to
returned) is measured both ways; the router's added latency is the difference of the
percentiles; the messages it relayed come from its
``asrpool_router_relayed_messages_total``. Router CPU is read from /proc over the routed
phases. On a machine without the cores for N streams the pods fall behind real time:
the JSON says so (``pods_kept_up``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import platform
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
import redis.asyncio as aioredis

from asrpool.bench import stats
from asrpool.client import local
from asrpool.common import processes, protocol, redis_clients, registry
from asrpool.router import admissions, settings, tokens


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asrpool bench router", description=__doc__)
    parser.add_argument("--routers", type=int, default=4)
    parser.add_argument("--admissions", type=int, default=2000, help="per router process")
    parser.add_argument("--in-flight", type=int, default=8, help="per router process")
    parser.add_argument("--fake-pods", type=int, default=50)
    parser.add_argument("--streams", default="100,500,1000", help="comma-separated counts")
    parser.add_argument("--pods", type=int, default=2)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seconds", type=float, default=10.0, help="per phase")
    parser.add_argument("--rounds", type=int, default=2, help="phases of each kind")
    parser.add_argument("--skip-proxy", action="store_true")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--baseline", choices=["nginx"], default=None,
                        help="compare the router's data path with nginx's in front of one "
                        "websocket backend (the harness's asrpool_harness.bench.nginx); "
                        "--streams, --seconds, --rounds")
    parser.add_argument("--router-arg", action="append", default=[],
                        help="extra flag for the router under --baseline (repeatable)")
    parser.add_argument("--churn-streams", type=int, default=1000,
                        help="under --baseline: short streams opened and closed per proxy and"
                        " round, for each proxy's CPU per stream (0: none)")
    return parser.parse_args(argv)


# Admission


def start_redis(workdir: Path) -> tuple[processes.Child, str]:
    port = processes.free_port()
    url = f"redis://127.0.0.1:{port}/0"
    child = processes.spawn("redis", processes.redis_server_argv(port, workdir),
                            workdir / "redis.log")
    processes.wait_until(lambda: processes.redis_answers(url), 10, "redis-server", [child])
    return child, url


def redis_client(url: str, decode_responses: bool = False) -> aioredis.Redis:
    """A client of the Redis that :func:`start_redis` started: each call has the local
    platform's deadline."""
    return redis_clients.connect(url, local.REDIS_TIMEOUT_SECONDS,
                                 decode_responses=decode_responses)


async def write_pods(url: str, count: int, slots: int) -> None:
    client = redis_client(url)
    for i in range(count):
        beat = registry.PodHeartbeat(f"pod-{i:03d}", "default", f"127.0.0.1:{i + 1}", slots,
                                     slots, False, "bench")
        await registry.write_heartbeat(client, beat, lease_ms=600_000)
    await client.aclose()


async def admit_loop(url: str, count: int, in_flight: int) -> list[float]:
    client = redis_client(url, decode_responses=True)
    store = admissions.Admissions(client, settings.RouterSettings(
        redis_url=url, members_required=False))  # its pods only heartbeat
    latencies: list[float] = []

    async def worker(n: int) -> None:
        for _ in range(n):
            token = tokens.mint("default", tokens.new_session_id())
            request = admissions.Request("default", "bench", 0, token, token.session_id)
            started = time.perf_counter()
            got = await store.admit(request)
            latencies.append(time.perf_counter() - started)
            if isinstance(got, admissions.Session):
                await store.release(got)

    await asyncio.gather(*(worker(count // in_flight) for _ in range(in_flight)))
    await client.aclose()
    return latencies


def admit_process(args: tuple[str, int, int]) -> list[float]:
    return asyncio.run(admit_loop(*args))


def bench_admission(opts: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as workdir:
        redis, url = start_redis(Path(workdir))
        try:
            asyncio.run(write_pods(url, opts.fake_pods, 64))
            started = time.perf_counter()
            with multiprocessing.get_context("spawn").Pool(opts.routers) as pool:
                runs = pool.map(admit_process,
                                [(url, opts.admissions, opts.in_flight)] * opts.routers)
            elapsed = time.perf_counter() - started
        finally:
            redis.stop(local.STOP_TIMEOUT)
    samples = [x for run in runs for x in run]
    return {"routers": opts.routers, "in_flight_per_router": opts.in_flight,
            "fake_pods": opts.fake_pods, "admissions_per_s": len(samples) / elapsed,
            "admit": stats.percentiles(samples)}


# Proxying

AUDIO = msgpack.packb({"type": "Audio", "pcm": [0.0] * protocol.FRAME_SIZE}, use_single_float=True)


async def one_stream(url: str, seconds: float, offset: float, rtts: list[float]) -> bool:
    """A real-time stream with a marker every second; False if it was refused."""
    from websockets.asyncio import client as ws_client

    await asyncio.sleep(offset)
    async with ws_client.connect(url, max_size=None, compression=None, proxy=None,
                                 open_timeout=60, close_timeout=2) as ws:
        first = msgpack.unpackb(await ws.recv(decode=False))
        if first.get("type") != "Ready":
            return False
        sent: dict[int, float] = {}
        receiver = asyncio.create_task(collect_markers(ws, sent, rtts))
        start, frames = time.monotonic(), int(seconds * protocol.FRAME_RATE)
        for k in range(frames):
            await asyncio.sleep(max(0.0, start + k / protocol.FRAME_RATE - time.monotonic()))
            await ws.send(AUDIO)
            if k % 12 == 11:
                sent[k] = time.perf_counter()
                await ws.send(msgpack.packb({"type": "Marker", "id": k}))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(receiver, 5)
        receiver.cancel()
    return True


async def collect_markers(ws: Any, sent: dict[int, float], rtts: list[float]) -> None:
    async for data in ws:
        body = msgpack.unpackb(data)
        if body.get("type") == "Marker" and body["id"] in sent:
            rtts.append(time.perf_counter() - sent.pop(body["id"]))


async def run_streams(urls: list[str], count: int, seconds: float, rtts: list[float]
                      ) -> dict[str, Any]:
    results = await asyncio.gather(
        *(one_stream(urls[i % len(urls)], seconds, i / count, rtts) for i in range(count)),
        return_exceptions=True,
    )
    admitted = sum(1 for r in results if r is True)
    failed = [repr(r) for r in results if isinstance(r, BaseException)][:3]
    return {"admitted": admitted, "failed": failed}


def relayed_messages(metrics_url: str) -> dict[str, float]:
    """Messages the router relayed each way (``asrpool_router_relayed_messages_total``)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    out = {}
    for direction in ("up", "down"):
        prefix = f'asrpool_router_relayed_messages_total{{direction="{direction}"}}'
        out[direction] = next((float(line.split()[-1]) for line in text.splitlines()
                               if line.startswith(prefix)), 0.0)
    return out


@contextlib.contextmanager
def unthrottled() -> Any:
    """Pods and routers started meanwhile take any number of new streams a second (their
    ``ASRPOOL_NEW_STREAMS_PER_SECOND`` 0): the bench opens its streams at once on purpose."""
    name = "ASRPOOL_NEW_STREAMS_PER_SECOND"
    saved = os.environ.get(name)
    os.environ[name] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def bench_proxy(opts: argparse.Namespace, count: int) -> dict[str, Any]:
    """Routed and direct phases alternate (``--rounds`` of each), so that warm-up and
    other load on the machine hit both alike."""
    slots = math.ceil(count / opts.pods)
    rtts: dict[str, list[float]] = {"routed": [], "direct": []}
    runs: dict[str, list[dict[str, Any]]] = {"routed": [], "direct": []}
    cpu = elapsed = 0.0
    with unthrottled(), \
            local.LocalPlatform(opts.pods, slots, opts.model, processes.free_port()) as plat:
        router_pid = next(c.process.pid for c in plat.children if c.name == "router")
        urls = {
            "routed": [plat.router_url + protocol.STREAMING_PATH],
            "direct": [f"ws://{p.address}{protocol.STREAMING_PATH}"
                       for p in asyncio.run(plat.snapshot())],
        }
        for r in range(opts.rounds):
            for mode in ("direct", "routed") if r % 2 == 0 else ("routed", "direct"):
                cpu0, t0 = processes.cpu_seconds(router_pid), time.monotonic()
                runs[mode].append(asyncio.run(run_streams(urls[mode], count, opts.seconds,
                                                          rtts[mode])))
                if mode == "routed":
                    cpu += processes.cpu_seconds(router_pid) - cpu0
                    elapsed += time.monotonic() - t0
                time.sleep(1.0)  # let the last streams' slots free
        relayed = relayed_messages(f"http://127.0.0.1:{plat.port}/metrics")
    rtt = {mode: stats.percentiles(samples) for mode, samples in rtts.items()}
    added = {q: rtt["routed"].get(q, math.nan) - rtt["direct"].get(q, math.nan)
             for q in ("p50_ms", "p99_ms")}
    return {"streams": count, "pods": opts.pods, "slots_per_pod": slots, "runs": runs,
            "marker_rtt": rtt, "router_added_ms": added, "router_relayed": relayed,
            "router_cpu_cores": cpu / elapsed if elapsed else math.nan,
            "pods_kept_up": all(r.get("p99_ms", math.inf) < 2000 for r in rtt.values())}


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    if opts.baseline == "nginx":
        from asrpool.bench import cli

        return int(cli.harness_module("nginx", "--baseline nginx").main(opts))
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # pods share the machine's cores
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "admission": bench_admission(opts),
        "proxy": [],
    }
    path = Path(opts.out) / f"router-{opts.model}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))  # written after every stage
    print(json.dumps(result["admission"], indent=2), flush=True)
    if not opts.skip_proxy:
        for count in (int(c) for c in opts.streams.split(",")):
            result["proxy"].append(bench_proxy(opts, count))
            path.write_text(json.dumps(result, indent=2))
            print(json.dumps(result["proxy"][-1], indent=2), flush=True)
    print(f"wrote {path}")
    return 0
