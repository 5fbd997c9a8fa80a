"""uvicorn with a drain between the first SIGTERM (or SIGINT) and the shutdown.

The pod and the router each drain their own way (``server.draining``,
``router.draining``): a subclass says how in :meth:`GracefulServer.drain`, which runs on
the server's loop once the first signal comes; when it returns, uvicorn shuts down. A
second signal cuts the drain short (a second SIGINT forces the exit). Unlike plain
uvicorn, the signal is not re-raised after the shutdown, so a drained process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

log = logging.getLogger(__name__)

POLL_SECONDS = 0.1


async def wait_while(busy: Callable[[], object], seconds: float) -> None:
    """Return once ``busy()`` is false (no stream left) or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while busy() and time.monotonic() < deadline:
        await asyncio.sleep(POLL_SECONDS)


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.draining: asyncio.Task[None] | None = None
        self.signalled = False

    async def drain(self) -> None:
        """Stop taking work and let the open work end; uvicorn shuts down once it returns."""
        raise NotImplementedError

    async def serve(self, sockets: list[Any] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.signalled or self.loop is None:
            self.should_exit = True
            if sig == signal.SIGINT and self.signalled:
                self.force_exit = True
            return
        self.signalled = True
        log.info("received %s: draining", signal.Signals(sig).name)
        self.loop.call_soon_threadsafe(self._begin)

    def _begin(self) -> None:
        self.draining = asyncio.create_task(self.drain())
        self.draining.add_done_callback(self._drained)

    def _drained(self, _: asyncio.Task[None]) -> None:
        self.should_exit = True

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        if self.draining is not None and not self.draining.done():
            self.draining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.draining
        await super().shutdown(sockets)
