"""Whether the pod keeps real time, and how far behind it is when it does not.

A real-time stream sends a frame every 80 ms and needs one transcribed every 80 ms. The
pod falls behind in one of two places:

- **the engine**: it is busy without a break (every step leaves some slot a whole frame
  still buffered) and its steps come more than 80 ms apart, so every stream gets less
  than one frame transcribed per 80 ms of its audio (too many slots for the device, a
  CPU's step growing with its rows, a GIL shared with a busy event loop). Each such step
  puts the streams ``interval - 80 ms`` further behind; a step that leaves no slot a
  whole frame means every stream has caught up.
- **the event loop**: it is busy all the time (its thread's CPU over
  :data:`SATURATED` of the wall clock) while audio waits for the engine (some step left
  a slot a whole frame: read late, a stream's audio comes in bursts), so sockets are read
  later and later and audio waits in the kernel where no slot's buffer shows it. Every
  second of that is counted as a second behind; a second with room to spare, or with no
  audio waiting, means it has caught up. A loop busy with one flooding client while
  the streams' audio flows is not behind.

:class:`RealTimeWatch` keeps both and says what the pod does about it: past
``admit_seconds`` behind it is *overloaded* and admits no new stream (until it is back
under half of that), and past ``shed_seconds``, while it still falls further behind, it
sheds its newest streams, a sixteenth of them at a time and at most once a second, so
that the rest keep real time.

Shedding relieves the host (each stream's intake, delivery and socket work), never the
engine: its step computes every row of its batch, busy or not (CUDA graphs on a GPU,
the masked batch on a CPU), so a step that alone takes longer than a frame
(:attr:`RealTimeWatch.engine_bound`: more slots than the device serves in real time)
keeps every stream behind however few remain. Such a pod admits no new stream and says
why; it sheds nothing, which would cut streams for no gain (``--batch-size auto`` sizes
a pod so that this does not happen). It holds numbers only; ``pods.Pod`` feeds it and
acts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from asrpool.common import protocol

FRAME_SECONDS = protocol.FRAME_SIZE / protocol.SAMPLE_RATE
SATURATED = 0.95  # the event loop's share of the wall clock that leaves it no slack
SHED_FRACTION = 1 / 16  # of the streams, shed at a time
SHED_EVERY_S = 1.0  # the least time between two sheds: each is given time to tell
STEP_SMOOTHING = 0.2  # weight of the newest step in the engine's mean step time
IDLE_AFTER_S = 1.0  # no step for this long: the engine has nothing to fall behind on


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What changed with one observation: the pod becomes overloaded or recovers, and
    how many of its newest streams to shed now."""

    overloaded_changed: bool = False
    shed: int = 0


class RealTimeWatch:
    """``admit_seconds``: behind this far, admit no new stream (0: always admit);
    ``shed_seconds``: behind this far and growing, shed the newest (0: never)."""

    def __init__(self, admit_seconds: float, shed_seconds: float) -> None:
        self.admit_seconds = admit_seconds
        self.shed_seconds = shed_seconds
        self.engine_behind = 0.0
        self.loop_behind = 0.0
        self.overloaded = False
        self._last_step: float | None = None
        self._backlogged = False  # the last step left some slot a whole frame
        self._backlog_seen = False  # some step since the last tick did
        self._last_tick: tuple[float, float] | None = None  # (wall, loop CPU) at the last tick
        self._last_shed = -math.inf
        self._behind_at_shed = 0.0
        self.step_seconds = 0.0  # the engine's own step (the model's), smoothed

    @property
    def engine_bound(self) -> bool:
        """The engine's step alone takes longer than a frame: no shedding helps."""
        return self.step_seconds >= FRAME_SECONDS

    @property
    def behind(self) -> float:
        """Seconds the pod's streams have fallen behind real time (0: it keeps up)."""
        return max(self.engine_behind, self.loop_behind)

    def step(self, now: float, buffered: Mapping[int, int], duration: float,
             streams: int) -> Verdict:
        """One step's output was delivered at ``now``; ``buffered``: samples each slot of
        the batch still holds; ``duration``: the engine's own step (0: no frame was
        stepped, markers or resets only); ``streams``: open now."""
        if not duration:
            return Verdict()
        weight = STEP_SMOOTHING if self.step_seconds else 1.0  # the first step as it is
        self.step_seconds += weight * (duration - self.step_seconds)
        backlogged = any(samples >= protocol.FRAME_SIZE for samples in buffered.values())
        if not backlogged:
            self.engine_behind = 0.0
        elif self._backlogged and self._last_step is not None:  # busy since the last step
            self.engine_behind = max(0.0, self.engine_behind + now - self._last_step
                                     - FRAME_SECONDS)
        self._backlogged = backlogged
        self._backlog_seen |= backlogged
        self._last_step = now
        return self._verdict(now, streams)

    def tick(self, now: float, loop_cpu: float, streams: int) -> Verdict:
        """A periodic look from the event loop: ``loop_cpu`` is its thread's CPU seconds
        so far (``time.thread_time()``)."""
        if self._last_tick is not None:
            wall = now - self._last_tick[0]
            busy = (loop_cpu - self._last_tick[1]) / wall if wall > 0 else 0.0
            saturated = busy >= SATURATED and self._backlog_seen
            self.loop_behind = self.loop_behind + wall if saturated else 0.0
        self._last_tick = (now, loop_cpu)
        self._backlog_seen = self._backlogged
        if self._last_step is None or now - self._last_step > IDLE_AFTER_S:
            self.engine_behind = 0.0  # no frame to step: nobody waits for the engine
            self._backlogged = False
        return self._verdict(now, streams)

    def _verdict(self, now: float, streams: int) -> Verdict:
        was = self.overloaded
        behind = self.behind
        if self.admit_seconds > 0:
            if behind >= self.admit_seconds:
                self.overloaded = True
            elif behind <= self.admit_seconds / 2:
                self.overloaded = False
        return Verdict(self.overloaded != was, self._to_shed(now, behind, streams))

    def _to_shed(self, now: float, behind: float, streams: int) -> int:
        """Shed only while the pod still falls further behind past the bound: a pod that
        is catching up keeps every stream it has."""
        if self.shed_seconds <= 0 or behind < self.shed_seconds:
            self._behind_at_shed = 0.0
            return 0
        if streams == 0 or self.engine_bound or now - self._last_shed < SHED_EVERY_S:
            return 0
        if behind <= self._behind_at_shed:
            self._behind_at_shed = behind  # it caught up some since: wait and see
            return 0
        self._last_shed = now
        self._behind_at_shed = behind
        return max(1, math.ceil(streams * SHED_FRACTION))
