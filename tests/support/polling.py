"""Wait for a condition with a deadline: no fixed sleeps as pass conditions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
DEADLINE_SECONDS = 20.0


async def eventually(check: Callable[[], T], timeout: float = DEADLINE_SECONDS,
                     period: float = 0.05) -> T:
    """``check()``'s result once it stops raising AssertionError (its last error if never)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return check()
        except (AssertionError, KeyError, TypeError, IndexError):
            if loop.time() > deadline:
                raise
        await asyncio.sleep(period)


async def until(condition: Callable[[], object], timeout: float = DEADLINE_SECONDS) -> None:
    """Return once ``condition()`` is truthy; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)
