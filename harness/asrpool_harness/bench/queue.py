"""Wait queue benchmark: order over a long wait, Redis memory per waiter, poll cost.
Writes JSON to ``bench/results/``.

    asrpool bench queue --waiters 200 --wait 10 --memory-waiters 10000

Order: a pool whose one pod is full; ``--waiters`` tickets arrive in order, then every
waiter polls (``ADMIT`` with its ticket, as a waiting router does every 0.1 s) in a
random order each round for ``--wait`` seconds, longer than a ticket's 3 s lease; every
rank seen that is not the waiter's arrival index is counted. Then slots free one by one
and the waiters are admitted: the admission order against the arrival order
(inversions: pairs served out of order).

Memory: ``--memory-waiters`` waiters of ``--keys`` API keys take a ticket; the
``MEMORY USAGE`` of the queue's keys per waiter (router-sized tickets). Poll cost: the time of one
waiter's ``ADMIT`` with that many waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from asrpool.bench import router as router_bench
from asrpool.client import local
from asrpool.common import registry
from asrpool.router import admissions, settings, tokens
from asrpool.router import keys as router_keys


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asrpool bench queue", description=__doc__)
    parser.add_argument("--waiters", type=int, default=200)
    parser.add_argument("--wait", type=float, default=10.0, help="seconds of polling")
    parser.add_argument("--memory-waiters", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=100, help="API keys the waiters have")
    parser.add_argument("--out", default="bench/results")
    return parser.parse_args(argv)


def _request(key_id: str = "") -> admissions.Request:
    token = tokens.mint("default", tokens.new_session_id())
    return admissions.Request("default", key_id, 0, token, token.session_id)


async def _pod(client: aioredis.Redis, free: int) -> None:
    beat = registry.PodHeartbeat("pod-0", "default", "127.0.0.1:1", 1_000_000, free, False,
                                 "bench")
    await registry.write_heartbeat(client, beat, lease_ms=600_000)


def _store(client: aioredis.Redis, url: str, lease_ms: int = 3000) -> admissions.Admissions:
    """A router's admissions; a ticket's lease is ``lease_ms`` (at least 2 s)."""
    config = settings.RouterSettings(redis_url=url, queue_timeout_seconds=300, queue_max=1_000_000,
                                     queue_max_per_key=0, session_lease_ms=lease_ms,
                                     members_required=False)  # its pod only heartbeats
    return admissions.Admissions(client, config)


async def _order(url: str, waiters: int, wait: float) -> dict[str, Any]:
    client = router_bench.redis_client(url, decode_responses=True)
    store = _store(client, url)
    await _pod(client, free=0)
    tickets = [f"t{i:05d}" for i in range(waiters)]
    for ticket in tickets:
        await store.admit(_request(), ticket=ticket)
    wrong, polls, started = 0, 0, time.monotonic()
    while time.monotonic() - started < wait:
        for i in random.sample(range(waiters), waiters):
            got = await store.admit(_request(), ticket=tickets[i])
            polls += 1
            wrong += int(not isinstance(got, admissions.Refused) or got.rank != i)
        await asyncio.sleep(0.1)
    served = await _serve_all(client, store, tickets)
    await client.aclose()
    inversions = sum(1 for a in range(len(served)) for b in range(a + 1, len(served))
                     if served[a] > served[b])
    return {"waiters": waiters, "seconds_until_all_admitted": round(time.monotonic() - started, 2),
            "polls": polls, "ranks_not_arrival_order": wrong,
            "admission_order_inversions": inversions, "admitted": len(served)}


async def _serve_all(client: aioredis.Redis, store: admissions.Admissions,
                     tickets: list[str]) -> list[int]:
    """Free one slot a round; every waiter polls each round (as its router would every
    0.1 s: a ticket not polled for 3 s is dropped); who got the slots, in order."""
    left, served = dict(enumerate(tickets)), []
    while left:
        await _pod(client, free=1)
        admitted = False
        for i in random.sample(sorted(left), len(left)):
            got = await store.admit(_request(), ticket=left[i])
            if isinstance(got, admissions.Session):
                served.append(i)
                del left[i]
                admitted = True
                await _pod(client, free=0)  # the pod reports the stream
                await client.delete(router_keys.pod_sessions(registry.DEFAULT_POOL, "pod-0"))
        if not admitted:
            break  # nobody admitted: the order is broken for good
    return served


async def _memory(url: str, waiters: int, keys: int) -> dict[str, Any]:
    client = router_bench.redis_client(url, decode_responses=True)
    await client.flushall()
    store = _store(client, url, lease_ms=3_600_000)  # nobody polls while they arrive
    await _pod(client, free=0)
    tickets = [uuid.uuid4().hex for _ in range(waiters)]  # as the router's
    for i, ticket in enumerate(tickets):
        await store.admit(_request(f"key-{i % keys}"), ticket=ticket)
    queue = router_keys.pool_queue(registry.DEFAULT_POOL)
    waiting = int(await client.zcard(queue))
    queue_keys = await client.keys(f"{queue}*")
    in_keys = sum([int(await client.memory_usage(k, samples=0) or 0) for k in queue_keys])
    poll = []
    for i in random.sample(range(waiters), min(waiters, 500)):
        t0 = time.perf_counter()
        await store.admit(_request(f"key-{i % keys}"), ticket=tickets[i])
        poll.append(time.perf_counter() - t0)
    await client.aclose()
    poll.sort()
    return {"arrivals": waiters, "waiting": waiting, "api_keys": keys,
            "bytes_per_waiter": round(in_keys / waiting, 1),  # MEMORY USAGE of the queue keys
            "queue_keys": len(queue_keys),
        "poll_ms_p50": round(statistics.median(poll) * 1000, 3),
        "poll_ms_p99": round(poll[int(len(poll) * 0.99) - 1] * 1000, 3)}


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        redis, url = router_bench.start_redis(Path(workdir))
        try:
            order = asyncio.run(_order(url, opts.waiters, opts.wait))
            memory = asyncio.run(_memory(url, opts.memory_waiters, opts.keys))
        finally:
            redis.stop(local.STOP_TIMEOUT)
    result = {"machine": platform.machine(), "python": platform.python_version(),
              "order": order, "memory": memory}
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "queue-waiters.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if order["ranks_not_arrival_order"] == 0 and order["admission_order_inversions"] == 0 \
        else 1
