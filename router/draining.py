"""SIGTERM on a router: stop taking streams, let the open ones run, then hand them back.

The first SIGTERM (or SIGINT) marks the router draining at once: ``/readyz`` answers
503 (Services and Ingresses stop sending it clients), and a new stream or a resume that
still arrives is told ``Error{code:"draining"}`` with close 1013 (try again: another
router takes it). Open streams relay on for ``drain_grace_seconds`` or until they end;
then uvicorn shuts down, and each stream left is told
``Error{code:"draining"}`` and closed 1012, its session held on its pod for a resume
through another router (``Relay.shutdown``). A second signal cuts the wait short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from types import FrameType
from typing import Any

import uvicorn

from asrpool.router import wiring

log = logging.getLogger(__name__)

POLL_SECONDS = 0.1


async def drain(deps: wiring.Deps, grace: float) -> None:
    """Wait until no stream is open through this router, or ``grace`` seconds."""
    deadline = time.monotonic() + grace
    while len(deps.sessions) and time.monotonic() < deadline:
        await asyncio.sleep(POLL_SECONDS)
    left = len(deps.sessions)
    if left:
        log.info("drain grace over: handing %d streams back for a resume", left)
    else:
        log.info("drained: no stream open")


class DrainingRouter(uvicorn.Server):
    """uvicorn, with a drain between the signal and the shutdown."""

    def __init__(self, config: uvicorn.Config, deps: wiring.Deps) -> None:
        super().__init__(config)
        self.deps = deps
        self.loop: asyncio.AbstractEventLoop | None = None
        self.draining: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[Any] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.deps.draining or self.loop is None:
            self.should_exit = True
            if sig == signal.SIGINT and self.deps.draining:
                self.force_exit = True
            return
        self.deps.draining = True  # readiness and admissions see it at once
        log.info("received %s: draining for up to %.0f s", signal.Signals(sig).name,
                 self.deps.config.drain_grace_seconds)
        self.loop.call_soon_threadsafe(self._begin)

    def _begin(self) -> None:
        self.draining = asyncio.create_task(drain(self.deps, self.deps.config.drain_grace_seconds))
        self.draining.add_done_callback(self._drained)

    def _drained(self, _: asyncio.Task[None]) -> None:
        self.should_exit = True

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        if self.draining is not None and not self.draining.done():
            self.draining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.draining
        await super().shutdown(sockets)
