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

import logging

import uvicorn

from asrpool.common import graceful
from asrpool.router import wiring

log = logging.getLogger(__name__)


async def drain(deps: wiring.Deps, grace: float) -> None:
    """Wait until no stream is open through this router, or ``grace`` seconds."""
    await graceful.wait_while(lambda: len(deps.sessions), grace)
    left = len(deps.sessions)
    if left:
        log.info("drain grace over: handing %d streams back for a resume", left)
    else:
        log.info("drained: no stream open")


class DrainingRouter(graceful.GracefulServer):
    """uvicorn, with the router's drain between the signal and the shutdown."""

    def __init__(self, config: uvicorn.Config, deps: wiring.Deps) -> None:
        super().__init__(config)
        self.deps = deps

    async def drain(self) -> None:
        self.deps.draining = True  # readiness and admissions see it at once
        log.info("draining for up to %.0f s", self.deps.config.drain_grace_seconds)
        await drain(self.deps, self.deps.config.drain_grace_seconds)
