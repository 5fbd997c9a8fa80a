"""The engine thread: the one owner of the model and its :class:`BatchedEngine`.

It loads the model, warms it up, then loops: take a :class:`slots.Batch` (resets,
markers, at most one frame per slot), run it, and hand the events back to the event
loop with ``loop.call_soon_threadsafe``. It steps as soon as any slot has a full frame:
no pacing, so a fast client is served as fast as the model allows and a real-time
client's frame waits at most one step.

Who runs a batch is a :class:`Runner`: :class:`InProcess` (the engine in this thread)
or ``enginechild.ChildRunner`` (the engine in a child process, ``--engine-process``).
Either runs any ``stepping.Engine``: the model's (``engine.BatchedEngine``) or its paced
stand-in (``pacing.PacedEngine``, ``--paced-engine``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from asrpool.common import protocol
from asrpool.server import events as events_mod
from asrpool.server import slots

if TYPE_CHECKING:
    from asrpool.server import pacing, stepping

logger = logging.getLogger(__name__)

EngineFactory = Callable[[], "stepping.Engine"]


@dataclasses.dataclass(frozen=True)
class StepOutput:
    """One batch's results, delivered on the event loop: each stream's messages already
    encoded where the step ran (the engine thread, or the engine process), so that the
    event loop only queues bytes."""

    generations: dict[int, int]
    messages: dict[int, list[bytes]]  # slot -> its protocol messages, in order
    markers: dict[int, int]  # slot -> how many of its messages are Markers
    buffered: dict[int, int]
    lags: dict[int, float]  # slot -> seconds from its frame's arrival to its output
    duration: float  # seconds spent in the model step (0 when no step ran)
    # With the engine in a child process: the rest of the step's time, the batch handed
    # over and its results back (0 in the engine thread).
    handover: float = 0.0
    # The events themselves, in the engine thread only (a child sends the messages alone).
    events: dict[int, list[events_mod.Event]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Ready:
    model_id: str
    state_nbytes: int
    pace: pacing.Pace | None = None  # a paced stand-in's (``--paced-engine``)
    delay: int = 0  # the model's steps from a frame to its word
    voice_activity: bool = False  # its extra heads say when the speaker pauses (prs)

    @classmethod
    def of(cls, engine: stepping.Engine) -> Ready:
        return cls(engine.model_id, engine.state_nbytes(), engine.pace, engine.delay,
                   engine.has_extra_heads)


class Runner(Protocol):
    """Runs batches for the engine thread: ``ready`` first (it loads and warms the
    model), then ``run`` per batch, ``close`` at the end; each raises what went wrong."""

    def ready(self) -> Ready: ...

    def run(self, batch: slots.Batch) -> StepOutput: ...

    def close(self) -> None: ...


@runtime_checkable
class Pipelined(Runner, Protocol):
    """A runner that takes the next batch while it steps one (``enginechild.ChildRunner``):
    ``submit`` hands a batch over, ``collect`` returns the oldest one's output."""

    @property
    def in_flight(self) -> int: ...

    @property
    def full(self) -> bool: ...

    def submit(self, batch: slots.Batch) -> None: ...

    def collect(self) -> StepOutput: ...


class InProcess:
    """The engine in the engine thread itself."""

    def __init__(self, factory: EngineFactory, warmup_steps: int = 2) -> None:
        self._factory = factory
        self._warmup_steps = warmup_steps
        self._engine: stepping.Engine | None = None

    def ready(self) -> Ready:
        self._engine = engine = self._factory()
        warm_up(engine, self._warmup_steps)
        return Ready.of(engine)

    def run(self, batch: slots.Batch) -> StepOutput:
        assert self._engine is not None, "run before ready"
        return run_batch(self._engine, batch)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()


class EngineLoop:
    """Runs batches in its own thread; callbacks run on ``loop``."""

    def __init__(self, open_runner: Callable[[], Runner], buffers: slots.SlotBuffers,
                 loop: asyncio.AbstractEventLoop, on_output: Callable[[StepOutput], None],
                 on_ready: Callable[[Ready], None],
                 on_failure: Callable[[BaseException], None]) -> None:
        self._open_runner = open_runner
        self._buffers = buffers
        self._loop = loop
        self._on_output = on_output
        self._on_ready = on_ready
        self._on_failure = on_failure
        self._thread = threading.Thread(target=self._run, name="asrpool-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._buffers.close()
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            runner = self._open_runner()
        except BaseException as exc:  # report every failure to start: the pod must exit
            self._loop.call_soon_threadsafe(self._on_failure, exc)
            return
        try:
            self._loop.call_soon_threadsafe(self._on_ready, runner.ready())
            if isinstance(runner, Pipelined):
                self._pipeline(runner)
            else:
                self._one_by_one(runner)
        except BaseException as exc:  # a dead engine must not leave a live-looking pod
            logger.exception("engine thread failed")
            self._loop.call_soon_threadsafe(self._on_failure, exc)
        finally:
            runner.close()


    def _one_by_one(self, runner: Runner) -> None:
        while (batch := self._buffers.take()) is not None:
            self._emit(runner.run(batch))

    def _pipeline(self, runner: Pipelined) -> None:
        """The next batch is taken and handed over while the last is stepped, and the
        last's output comes back after: a step's hand-over overlaps the one before. It
        waits for work only with nothing in flight, so a lone frame is stepped at once."""
        while True:
            batch = self._buffers.take(wait=not runner.in_flight)
            if batch is not None:
                runner.submit(batch)
            if not runner.in_flight:
                return  # closed
            if batch is None or runner.full:
                self._emit(runner.collect())

    def _emit(self, output: StepOutput) -> None:
        self._loop.call_soon_threadsafe(self._on_output, output)


def warm_up(engine: stepping.Engine, steps: int) -> None:
    """The first steps pay for compilation and allocation; pay before taking clients."""
    started = time.monotonic()
    silence = np.zeros(slots.FRAME_SIZE, dtype=np.float32)
    for _ in range(steps):
        engine.step(dict.fromkeys(range(engine.batch_size), silence))
    engine.reset_slots(range(engine.batch_size))
    logger.info("engine warmed up in %.1f s", time.monotonic() - started)


def run_batch(engine: stepping.Engine, batch: slots.Batch) -> StepOutput:
    if batch.resets:
        engine.reset_slots(batch.resets)
    restarted = sorted(set(batch.restarts) - set(batch.resets))  # a reset restarts too
    if restarted:
        engine.reset_slots(restarted, keep_markers=True)
    for slot, marker_id, frames_pending in batch.markers:
        engine.add_marker(slot, marker_id, frames_pending)
    readies = _readies(batch.restarts)
    if not batch.frames:
        return _output(batch, readies, {}, 0.0)
    started = time.monotonic()
    result = engine.step(batch.frames, checked=True)  # every sample was checked coming in
    done = time.monotonic()
    lags = {slot: done - arrival for slot, arrival in batch.arrivals.items()}
    return _output(batch, _before(readies, result.events), lags, done - started)


def _output(batch: slots.Batch, said: dict[int, list[events_mod.Event]],
            lags: dict[int, float], duration: float) -> StepOutput:
    messages, markers = encode(said, batch.buffered)
    return StepOutput(batch.generations, messages, markers, batch.buffered, lags, duration,
                      events=said)


def encode(said: dict[int, list[events_mod.Event]], buffered: dict[int, int]
           ) -> tuple[dict[int, list[bytes]], dict[int, int]]:
    """Each slot's events as protocol messages (a Step says what stays buffered), and how
    many of them are Markers."""
    messages: dict[int, list[bytes]] = {}
    markers: dict[int, int] = {}
    for slot, slot_events in said.items():
        pcm = buffered.get(slot, 0)
        messages[slot] = [protocol.encode(events_mod.to_message(event, pcm))
                          for event in slot_events]
        done = sum(isinstance(event, events_mod.Marker) for event in slot_events)
        if done:
            markers[slot] = done
    return messages, markers


def _readies(restarts: list[int]) -> dict[int, list[events_mod.Event]]:
    """A Ready for every Init done in this batch, in the stream's order of events."""
    out: dict[int, list[events_mod.Event]] = {}
    for slot in restarts:
        out.setdefault(slot, []).append(events_mod.Restarted())
    return out


def _before(first: dict[int, list[events_mod.Event]],
            then: dict[int, list[events_mod.Event]]) -> dict[int, list[events_mod.Event]]:
    if not first:
        return then
    return {slot: [*first.get(slot, []), *then.get(slot, [])] for slot in {*first, *then}}
