"""SIGTERM: drain the pod, then let uvicorn exit 0.

The first SIGTERM (or SIGINT) marks the pod draining at once (readiness and the Redis
heartbeat), new streams get ``Error{code:"draining"}``, open streams may finish for
``drain_grace_seconds`` (streams held for a resume too); the rest then get
``Error{"server shutting down: ...", code:"draining", processed_seconds}`` and a
close, and only then does uvicorn stop listening and shut down. A second signal cuts
the wait short. Unlike plain uvicorn, the signal is not re-raised after the shutdown,
so a drained pod exits 0.
"""

from __future__ import annotations

import logging

import uvicorn

from asrpool.common import graceful, protocol
from asrpool.server import outcomes, pods

logger = logging.getLogger(__name__)

_CLOSE_SECONDS = 3.0


async def drain(pod: pods.Pod, grace: float) -> None:
    """Wait for every stream up to ``grace`` seconds, then end the rest.

    Streams held for a resume are waited for too (their client may come back, and a
    resume is accepted while draining); each stream still attached at the end hears
    how far its audio was transcribed.
    """
    await graceful.wait_while(lambda: pod.sessions.used, grace)
    leftover = pod.sessions.streams()
    if leftover:
        logger.info("drain grace over: closing %d streams", len(leftover))
    for stream in leftover:
        if stream.attached:
            received = pod.buffers.received(stream.slot)
            # What the model took (buffered counts Opus still in a lane's child too).
            processed = pod.buffers.taken(stream.slot) * protocol.FRAME_SIZE
            stream.end_connection(outcomes.shutting_down(processed, received))
        else:
            pod.sessions.close(stream)
    await graceful.wait_while(lambda: pod.sessions.used, _CLOSE_SECONDS)
    logger.info("drained")


class DrainingServer(graceful.GracefulServer):
    """uvicorn, with the pod's drain between the signal and the shutdown."""

    def __init__(self, config: uvicorn.Config, pod: pods.Pod) -> None:
        super().__init__(config)
        self.pod = pod

    async def drain(self) -> None:
        try:
            if self.pod.begin_drain():  # False: it was not serving, nothing to drain
                await drain(self.pod, self.pod.settings.drain_grace_seconds)
        finally:
            self.pod.stopped.set()

    async def on_tick(self, counter: int) -> bool:
        if self.pod.stopped.is_set():
            self.should_exit = True
        return await super().on_tick(counter)
