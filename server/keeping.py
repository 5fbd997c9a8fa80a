"""A pod kept in real time: what its :class:`overload.RealTimeWatch` says after every
engine step and twice a second is acted on. Behind past ``--overload-seconds``, the pod
takes no new stream (its heartbeat says so at once); further behind past
``--shed-seconds``, it ends its newest streams so that the rest keep up, unless its
engine's own step is over a frame (then no stream keeps up, and shedding would not help:
it says so)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from asrpool.common import protocol
from asrpool.server import metrics, outcomes, overload, sessions

logger = logging.getLogger(__name__)

TICK_S = 0.5


class Keeper:
    def __init__(self, watch: overload.RealTimeWatch, streams: sessions.Sessions,
                 meters: metrics.ServerMetrics, changed: Callable[[], None]) -> None:
        self.watch = watch
        self.streams = streams
        self.meters = meters
        self.changed = changed  # the pod's heartbeat is to say so now

    async def run(self) -> None:
        """Look at the event loop's own load (and notice an idle engine) twice a second."""
        while True:
            await asyncio.sleep(TICK_S)
            self.judge(self.watch.tick(time.monotonic(), time.thread_time(),
                                       self.streams.used))

    def judge(self, verdict: overload.Verdict) -> None:
        if verdict.overloaded_changed:
            self._overloaded(self.watch.overloaded)
        if verdict.shed:
            self._shed(verdict.shed)

    def _overloaded(self, overloaded: bool) -> None:
        self.meters.overloaded.set(int(overloaded))
        self.changed()
        if not overloaded:
            logger.info("caught up with real time: taking new streams again")
            return
        watch = self.watch
        logger.warning("overloaded: %.1f s behind real time (engine %.1f s, event loop "
                       "%.1f s); no new streams until it catches up",
                       watch.behind, watch.engine_behind, watch.loop_behind)
        if watch.engine_bound:
            logger.error(
                "the engine's own step takes %.0f ms for %d slots, over a frame's "
                "80 ms: no stream keeps real time on this pod however few it "
                "serves, and shedding would not help; serve fewer slots "
                "(--batch-size auto measures how many)",
                watch.step_seconds * 1e3, self.streams.total)

    def _shed(self, count: int) -> None:
        """End the newest streams so that the rest keep real time."""
        behind = self.watch.behind
        shed = self.streams.newest(count)
        logger.warning("%.1f s behind real time and falling further: shedding the %d newest "
                       "of %d streams", behind, len(shed), self.streams.used)
        self.meters.shed.inc(len(shed))
        failed = outcomes.Failed(
            f"server fell {behind:.1f} s behind real time: its newest streams are ended so "
            "that the rest keep up; connect again", protocol.ErrorCode.OVERLOADED,
            protocol.CloseCode.TRY_AGAIN)
        for stream in shed:
            if stream.attached:
                stream.end_connection(failed)
            else:
                self.streams.close(stream)
