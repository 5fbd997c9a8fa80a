"""A router's shutdown ends within its bounds, whatever its Redis client does: once in
CI a router waited out a 20 s grace in its lifespan's shutdown, its loops or its Redis
client never answering the cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import time

import redis
import redis.asyncio as aioredis

from asrpool.router import leasing, metrics, wiring


async def _cancellation_turned_into_an_error(batch: list[int]) -> list[int]:
    """A call that, cancelled, raises a Redis error instead (as a client may)."""
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        raise redis.ConnectionError("connection closed by the cancellation") from None
    return batch


async def test_a_renewal_loop_cancelled_inside_a_failing_call_stops() -> None:
    async def renew() -> None:
        while True:  # as renew_forever: an error is an outage, tried again next period
            async for _ in leasing._in_batches([1], _cancellation_turned_into_an_error,
                                               metrics.Metrics(), "renew"):
                pass
            await asyncio.sleep(0.01)

    task = asyncio.create_task(renew())
    await asyncio.sleep(0.1)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert task in done and task.cancelled()


async def test_stopping_is_bounded_when_a_loop_ignores_its_cancellation() -> None:
    released = asyncio.Event()

    async def stubborn() -> None:
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0.05)  # into its sleep
    client = aioredis.Redis(host="127.0.0.1", port=1)  # never connected: closes at once
    started = time.monotonic()
    await wiring._stop([task], client)
    assert time.monotonic() - started < wiring.STOP_SECONDS + 1.5
    assert not task.done()  # it was waited for no longer than the bound
    released.set()
    task.cancel()
    await asyncio.wait({task}, timeout=2)
