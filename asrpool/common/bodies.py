"""Request bodies read up to a limit, at a minimum pace (``POST /api/asr-streaming`` on
pods and routers).

A body is read chunk by chunk and given up as soon as it passes the limit, so that a
client cannot make a pod or router hold more than the limit in memory; and, as nginx's
``client_body_timeout``, a client that sends nothing for ``timeout_seconds``, or less
than ``min_bytes_per_second`` on average once that long has passed, is refused (408),
so that a slow body cannot hold memory and a connection for hours. Once the body is
read, :func:`disconnected` and :func:`unless_gone` end the work a request started as
soon as its client closes the connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette import requests

T = TypeVar("T")


class TooLarge(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"body of {size}+ bytes exceeds the limit of {limit} bytes")


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""

    def __init__(self) -> None:
        super().__init__("the client went away")


class TooSlow(Exception):
    """A body whose pieces stopped coming, or came too slowly; the message says which."""


@dataclasses.dataclass(frozen=True)
class Pace:
    timeout_seconds: float  # the longest wait for the next piece
    min_bytes_per_second: int  # the slowest average once timeout_seconds has passed (0: any)


async def read_limited(request: requests.Request, limit: int, pace: Pace) -> bytes:
    """The whole body; raises :class:`TooLarge` once it passes ``limit`` bytes, and
    :class:`TooSlow` once it falls behind ``pace``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(int(declared), limit)
    loop = asyncio.get_running_loop()
    began = loop.time()
    body = bytearray()
    pieces = request.stream().__aiter__()
    while True:
        try:
            body += await asyncio.wait_for(anext(pieces), pace.timeout_seconds)
        except StopAsyncIteration:
            return bytes(body)
        except TimeoutError:
            raise TooSlow(f"no body data for {pace.timeout_seconds:g} s "
                          "(body_timeout_seconds)") from None
        if len(body) > limit:
            raise TooLarge(len(body), limit)
        _check_rate(len(body), loop.time() - began, pace)


def _check_rate(size: int, elapsed: float, pace: Pace) -> None:
    if elapsed > pace.timeout_seconds and size < pace.min_bytes_per_second * elapsed:
        raise TooSlow(f"the body came at {size / elapsed:.0f} bytes/s, under the minimum of "
                      f"{pace.min_bytes_per_second} (min_body_bytes_per_second)")


async def disconnected(request: requests.Request) -> None:
    """Returns once the client has closed its connection (call it once the body is read:
    the next ASGI message is then the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_gone(gone: asyncio.Future[None], work: Awaitable[T]) -> T:
    """``work``'s result, or :class:`ClientGone` once ``gone`` (a task of
    :func:`disconnected`) is done first; ``work`` is then cancelled."""
    task = asyncio.ensure_future(work)
    waiting: list[asyncio.Future[Any]] = [task, gone]
    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientGone
    return task.result()
