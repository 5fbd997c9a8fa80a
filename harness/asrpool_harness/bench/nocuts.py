"""Streams through the platform's own operations: a pod killed, a router told to stop.
Writes JSON to ``bench/results/``.

    asrpool bench nocuts --streams 20 --seconds 10

Pod loss: a local platform (Redis, two ``tiny`` pods of ``--streams`` slots each, a
router packing streams onto one pod); ``--streams`` clients stream noise at real time
for ``--seconds``, then a marker; at a third of the way the pod holding them is
SIGKILLed. Each stream is kept (its marker back, no ``Error``, no close) or cut; the
longest gap between two messages a kept stream received, around the kill, says how
long its move took as its client saw it.

Router drain: the same streams through a second router of ``--drain-grace`` seconds,
told SIGTERM a third of the way: streams cut before their end, and how long the
router took to exit after its last stream ended.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import websockets
from websockets.asyncio import client as ws_client

from asrpool.bench import reports
from asrpool.client import local
from asrpool.common import processes, protocol

MARKER = 7


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asrpool bench nocuts", description=__doc__)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0, help="audio per stream")
    parser.add_argument("--drain-grace", type=float, default=60.0)
    parser.add_argument("--out", default="bench/results")
    return parser.parse_args(argv)


async def _stream(url: str, seconds: float, seed: int) -> dict[str, Any]:
    """One client at real time: noise, a marker, silence; every message's arrival."""
    rng = np.random.default_rng(seed)
    frames = int(seconds / 0.08)
    arrivals: list[float] = []
    ended: dict[str, Any] = {"kept": False, "error": None, "close": None}
    async with ws_client.connect(url, max_size=None, compression=None, proxy=None) as ws:
        await ws.recv()  # Ready

        async def send() -> None:
            started = time.monotonic()
            for index in range(frames + 25):
                pcm = (rng.standard_normal(protocol.FRAME_SIZE) * 0.1 if index < frames
                       else np.zeros(protocol.FRAME_SIZE)).astype(np.float32)
                await ws.send(msgpack.packb({"type": "Audio", "pcm": pcm.tolist()},
                                            use_single_float=True))
                if index == frames:
                    await ws.send(msgpack.packb({"type": "Marker", "id": MARKER}))
                await asyncio.sleep(max(0.0, started + (index + 1) * 0.08 - time.monotonic()))

        sender = asyncio.create_task(send())
        try:
            while True:
                message = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 60))
                arrivals.append(time.monotonic())
                if message.get("type") == "Error":
                    ended["error"] = message.get("code")
                if message.get("type") == "Marker" and message.get("id") == MARKER:
                    ended["kept"] = ended["error"] is None
                    break
        except (websockets.ConnectionClosed, TimeoutError):
            ended["close"] = ws.close_code
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    return {**ended, "arrivals": arrivals}


def _gaps(outcomes: list[dict[str, Any]], around: float) -> list[float]:
    """Each kept stream's longest wait between two messages, from 2 s before ``around``."""
    out = []
    for outcome in outcomes:
        times = [t for t in outcome["arrivals"] if t >= around - 2.0]
        if outcome["kept"] and len(times) > 1:
            out.append(max(b - a for a, b in itertools.pairwise(times)))
    return out


def _summary(outcomes: list[dict[str, Any]], around: float) -> dict[str, Any]:
    gaps = _gaps(outcomes, around)
    return {
        "streams": len(outcomes),
        "kept": sum(o["kept"] for o in outcomes),
        "cut": [{"error": o["error"], "close": o["close"]} for o in outcomes if not o["kept"]],
        "longest_gap_ms": round(max(gaps) * 1e3, 1) if gaps else None,
        "median_longest_gap_ms": round(float(np.median(gaps)) * 1e3, 1) if gaps else None,
    }


async def _streams(url: str, count: int, seconds: float,
                   at_third: Callable[[], Awaitable[None]]) -> tuple[list[dict[str, Any]], float]:
    tasks = [asyncio.create_task(_stream(url, seconds, seed)) for seed in range(count)]
    await asyncio.sleep(seconds / 3)
    when = time.monotonic()
    await at_third()
    return list(await asyncio.gather(*tasks)), when


def pod_loss(count: int, seconds: float) -> dict[str, Any]:
    with local.LocalPlatform(2, count, "tiny", processes.free_port()) as platform_:
        async def kill_the_busy_pod() -> None:
            beats = await platform_.snapshot()
            busy = min(beats, key=lambda beat: beat.free_slots).pod_id  # pack: all on it
            child = next(child for child in platform_.children if child.name == busy)
            child.process.send_signal(signal.SIGKILL)

        url = platform_.router_url + protocol.STREAMING_PATH
        outcomes, when = asyncio.run(_streams(url, count, seconds, kill_the_busy_pod))
    return _summary(outcomes, when)


def router_drain(count: int, seconds: float, grace: float) -> dict[str, Any]:
    with local.LocalPlatform(1, count, "tiny", processes.free_port()) as platform_:
        port = processes.free_port()
        router = processes.spawn("router-drained", [
            sys.executable, "-m", "asrpool.cli", "route", "--redis-url", platform_.redis_url,
            "--host", local.HOST, "--port", str(port), "--members-required",
            "--drain-grace-seconds", str(grace), "--workers", "1"],
            platform_.workdir / "router-drained.log",
            env={**os.environ, "ASRPOOL_REDIS_PASSWORD": platform_.redis_password})
        processes.wait_until(lambda: processes.port_answers(port), 30, "the router", [router])
        url = f"ws://{local.HOST}:{port}{protocol.STREAMING_PATH}"
        async def stop_the_router() -> None:
            router.process.send_signal(signal.SIGTERM)

        outcomes, when = asyncio.run(_streams(url, count, seconds, stop_the_router))
        last_end = max(max(o["arrivals"], default=when) for o in outcomes)
        try:
            code = router.process.wait(timeout=grace + 10)
        except subprocess.TimeoutExpired:
            router.process.kill()
            code = router.process.wait()
        exited = time.monotonic()
    return {**_summary(outcomes, when), "router_exit_code": code,
            "router_exit_after_last_stream_s": round(exited - last_end, 2)}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    result = {
        "benchmark": "nocuts",
        "python": platform.python_version(),
        "streams": args.streams,
        "audio_seconds": args.seconds,
        "pod_killed": pod_loss(args.streams, args.seconds),
        "router_drained": router_drain(args.streams, args.seconds, args.drain_grace),
        "machine": reports.machine(started),
    }
    reports.write(Path(args.out), f"nocuts-{args.streams}.json", result)
    ok = (result["pod_killed"]["kept"] == args.streams
          and result["router_drained"]["kept"] == args.streams)
    return 0 if ok else 1
