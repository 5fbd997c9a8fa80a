"""A connection's idle deadline, kept by one timer that is set again only when it fires.

A stream is idle once no binary message has come for ``seconds`` while its reader waits
for one and the engine has none of its audio (a full frame buffered is work still to do,
so the deadline moves on a second at a time). A timeout per message cost the event loop
two thirds of what receiving the message costs (``asrpool bench sockets``): here a
message costs its reader one clock read (:meth:`IdleWatch.active`), and the timer looks
at the clock when it fires.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette import websockets

LOOK_AGAIN_S = 1.0  # while the reader is busy or the engine has the stream's audio


class IdleWatch:
    """Cancels the reader task (the one that builds it) once its stream is idle; the
    reader then asks :meth:`expired` whether that was why."""

    def __init__(self, seconds: float, busy: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        self.seconds = seconds
        self.waiting = False  # the reader waits for a message (set and cleared by it)
        self._busy = busy  # the engine still has the stream's audio
        self._clock = loop.time  # the loop's own clock (uvloop's is not time.monotonic)
        self._last = self._clock()
        self._expired = False
        self._reader = asyncio.current_task()
        self._timer = loop.call_at(self._last + seconds, self._check)

    async def receive(self, ws: websockets.WebSocket) -> Any:
        """The next ASGI event of ``ws``, its wait counted as idle time (the caller
        says :meth:`active` for a message that is a sign of life)."""
        self.waiting = True
        try:
            return await ws.receive()
        finally:
            self.waiting = False

    def active(self) -> None:
        """The client sent a sign of life: the deadline counts from now."""
        self._last = self._clock()

    def expired(self) -> bool:
        """Whether the reader was cancelled for idleness (then its cancel is taken back,
        once: the reader ends with the idle outcome, not as cancelled)."""
        if self._expired and self._reader is not None:
            self._reader.uncancel()
            self._reader = None
        return self._expired

    def close(self) -> None:
        self._timer.cancel()

    def _check(self) -> None:
        loop = asyncio.get_running_loop()
        due = self._last + self.seconds
        if self._clock() < due:
            self._timer = loop.call_at(due, self._check)
        elif not self.waiting or self._busy():
            self._timer = loop.call_later(LOOK_AGAIN_S, self._check)
        elif self._reader is not None:
            self._expired = True
            self._reader.cancel()
