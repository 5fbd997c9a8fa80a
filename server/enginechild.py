"""The engine in a child process of its own (``--engine-process``).

In one process the engine thread shares the GIL with the event loop, which reads,
decodes and answers every stream: on the first H200 run a pod of 768 stt-1b-en_fr
slots kept up with 256 clients and not 512, its steps lengthened by the loop's work.
Here the child owns the model and runs each :class:`slots.Batch` (``run_batch``, as the
thread does); the pod's engine thread only hands batches over and results back.

- Frames travel in two shared arrays of ``batch_size`` rows of 1920 samples, used in
  turn: the parent writes the rows of batch N+1 into one while the child steps batch N
  from the other (:meth:`ChildRunner.submit`, then :meth:`ChildRunner.collect` of the
  older batch), so the hand-over (rows, pickles, pipe, the parent's GIL) overlaps the
  child's step instead of adding to it. A buffer is written again only once the batch
  that used it has come back. The batch's resets, restarts, markers and rows, and the
  step's events and duration, travel pickled on a pipe (the rest of a batch and its
  output stays in the parent).
- The child ignores SIGINT and SIGTERM: the pod decides when it ends (a Ctrl-C in a
  terminal reaches the whole process group, and the pod drains first). It exits when
  the pipe closes, so a pod killed outright takes it along.
- Any failure of the child (its load, a step, its death) raises in the parent's engine
  thread, which fails the pod as a failed engine thread does.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import logging
import multiprocessing
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import connection
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from asrpool.common import logs
from asrpool.server import engine_loop, slots

if TYPE_CHECKING:
    from asrpool.server import models, stepping
    from asrpool.server import settings as settings_mod

logger = logging.getLogger(__name__)

STOP_TIMEOUT = 10.0
BUFFERS = 2  # batches in flight: one stepped by the child, the next handed over


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """What the engine is built from: picklable, so a child process can build it."""

    model: str
    batch_size: int
    device: str = "cpu"
    dtype: str = "auto"
    context: int | None = None
    revision: str | None = None
    torch_threads: int | None = None
    paced_engine: str | None = None  # a bench capacity file: no model, its paced stand-in

    @classmethod
    def of(cls, config: settings_mod.ServerSettings) -> EngineSpec:
        paced = None if config.paced_engine is None else str(config.paced_engine)
        return cls(config.model, config.slots, config.device, config.dtype,
                   config.context, config.model_revision, config.torch_threads, paced)


def build_engine(spec: EngineSpec) -> stepping.Engine:
    """The model's engine, or the paced stand-in of a bench capacity file (no torch)."""
    if spec.paced_engine is not None:
        from asrpool.server import pacing  # no torch: a paced pod never loads it

        return pacing.build(spec.paced_engine, spec.batch_size)
    from asrpool.server import engine, sizing  # torch is imported only when the pod starts

    model = load_model(spec)
    sizing.check_fits(model, spec.batch_size)
    return engine.BatchedEngine(model, spec.batch_size)


def load_model(spec: EngineSpec) -> models.LoadedModel:
    """The model ``spec`` names, on its device, in its dtype, with its torch threads."""
    import torch

    from asrpool.server import models

    if spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)
    dtype = models.resolve_dtype(spec.dtype, spec.device)
    return models.load_model(spec.model, spec.device, dtype, spec.context, spec.revision)


@dataclasses.dataclass(frozen=True)
class _Failed:
    """The child's last word: what went wrong, with the exception where it pickles (so a
    model that cannot be had is still ``models.ModelError``: the pod's exit 3)."""

    stage: str
    trace: str
    error: BaseException | None

    @classmethod
    def now(cls, stage: str, error: BaseException) -> _Failed:
        trace = "".join(traceback.format_exception(error))
        try:
            pickle.loads(pickle.dumps(error))
        except Exception:  # any exception may refuse to pickle, or to unpickle
            return cls(stage, trace, None)
        return cls(stage, trace, error)


class EngineChildError(RuntimeError):
    pass


class ChildRunner:
    """The parent's side: runs batches in the child; one caller (the engine thread)."""

    def __init__(self, spec: EngineSpec, warmup_steps: int,
                 on_exit: Callable[[BaseException], object] | None = None,
                 in_flight: int = BUFFERS) -> None:
        """``on_exit`` hears (from a thread of its own) of a child that exits before
        ``close``: an idle pod's engine thread waits for work and would not notice.
        ``in_flight``: batches handed over at a time, 1 or ``BUFFERS``."""
        if not 1 <= in_flight <= BUFFERS:
            raise ValueError(f"batches in flight must be 1 to {BUFFERS}, got {in_flight}")
        self._most_in_flight = in_flight
        context = multiprocessing.get_context("spawn")  # never fork a process holding CUDA
        shared = [context.RawArray(ctypes.c_float, spec.batch_size * slots.FRAME_SIZE)
                  for _ in range(BUFFERS)]
        self._rows = [_rows(buffer, spec.batch_size) for buffer in shared]
        self._in_flight: collections.deque[_Submitted] = collections.deque()
        self._submitted = 0  # batches so far: batch k uses buffer k % BUFFERS
        self._last_back = 0.0  # when the last output came back
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=_child_main,
            args=(spec, warmup_steps, child_conn, shared,
                  logging.getLogger().getEffectiveLevel()),
            name="asrpool-engine", daemon=True)
        self._process.start()
        child_conn.close()
        self._closing = False
        self._on_exit = on_exit
        threading.Thread(target=self._watch, name="asrpool-engine-watch", daemon=True).start()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def ready(self) -> engine_loop.Ready:
        """Blocks until the child has loaded and warmed the model."""
        answer = self._receive()
        assert isinstance(answer, engine_loop.Ready), answer
        return answer

    @property
    def in_flight(self) -> int:
        """Batches submitted whose output has not been collected."""
        return len(self._in_flight)

    @property
    def full(self) -> bool:
        """Whether a batch must be collected before the next is submitted."""
        return len(self._in_flight) >= self._most_in_flight

    def run(self, batch: slots.Batch) -> engine_loop.StepOutput:
        """One batch, start to end (nothing else in flight)."""
        self.submit(batch)
        return self.collect()

    def submit(self, batch: slots.Batch) -> None:
        """Hand a batch over: the child steps it after those in flight (at most
        ``BUFFERS`` at a time: collect one first)."""
        assert not self.full, "collect before submitting more"
        started = time.monotonic()
        buffer = self._submitted % BUFFERS
        if batch.frames:  # in one call: no switch of the GIL in the middle of it
            self._rows[buffer][list(batch.frames)] = np.stack(list(batch.frames.values()))
        # The child needs the resets, restarts and markers, which rows hold frames, and
        # what stays buffered (its Steps say so); what the output only carries through
        # (generations) and the frames' arrivals stay here.
        work = dataclasses.replace(batch, generations={}, frames={}, arrivals={})
        try:
            self._conn.send((work, list(batch.frames), buffer))
        except OSError:
            raise self._gone() from None
        self._submitted += 1
        self._in_flight.append(_Submitted(batch, started))

    def collect(self) -> engine_loop.StepOutput:
        """The output of the oldest batch in flight, once the child has stepped it."""
        submitted = self._in_flight.popleft()
        output = self._receive()
        assert isinstance(output, engine_loop.StepOutput), output
        done = time.monotonic()  # the lag of a frame includes its way back
        # The child started this batch once it was here and the one before was done:
        # the hand-over is the rest, what the overlap did not hide.
        began = max(submitted.started, self._last_back)
        self._last_back = done
        batch = submitted.batch
        return dataclasses.replace(
            output, generations=batch.generations, buffered=batch.buffered,
            lags={slot: done - arrival for slot, arrival in batch.arrivals.items()},
            handover=max(0.0, done - began - output.duration))

    def close(self, timeout: float = STOP_TIMEOUT) -> None:
        self._closing = True
        with contextlib.suppress(OSError):  # the child may be gone already
            self._conn.send(None)
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout)
        self._conn.close()

    def _receive(self) -> object:
        try:
            answer: object = self._conn.recv()
        except (EOFError, OSError):
            raise self._gone() from None
        if isinstance(answer, _Failed):
            logger.error("the engine process failed to %s:\n%s", answer.stage, answer.trace)
            raise answer.error or EngineChildError(f"the engine process failed to "
                                                   f"{answer.stage}")
        return answer

    def _watch(self) -> None:
        connection.wait([self._process.sentinel])
        if not self._closing and self._on_exit is not None:
            self._on_exit(self._gone())

    def _gone(self) -> EngineChildError:
        self._process.join(STOP_TIMEOUT)
        return EngineChildError(f"the engine process exited (code {self._process.exitcode}) "
                                "without an answer")


@dataclasses.dataclass(frozen=True)
class _Submitted:
    batch: slots.Batch
    started: float  # when its hand-over began


def _rows(shared: Any, batch_size: int) -> NDArray[np.float32]:
    rows: NDArray[np.float32] = np.frombuffer(shared, dtype=np.float32).reshape(
        batch_size, slots.FRAME_SIZE)
    return rows


def _child_main(spec: EngineSpec, warmup_steps: int, conn: connection.Connection,
                shared: list[Any], log_level: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logs.configure(log_level)  # a spawned child starts with logging as Python leaves it
    stage = "load the model"
    try:
        engine = build_engine(spec)
    except BaseException as exc:  # every failure to load is the pod's to report
        _last_word(conn, _Failed.now(stage, exc))
        return
    try:
        stage = "warm up"
        engine_loop.warm_up(engine, warmup_steps)
        conn.send(engine_loop.Ready.of(engine))
        stage = "run a step"
        _serve(engine, conn, [_rows(buffer, spec.batch_size) for buffer in shared])
    except BaseException as exc:
        _last_word(conn, _Failed.now(stage, exc))
    finally:
        engine.close()


def _last_word(conn: connection.Connection, failed: _Failed) -> None:
    with contextlib.suppress(OSError):  # the pod may be gone: that may be the failure
        conn.send(failed)


def _serve(engine: stepping.Engine, conn: connection.Connection,
           rows: list[NDArray[np.float32]]) -> None:
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the pod is gone
            return
        if message is None:
            return
        batch, frame_slots, buffer = message
        frames = {slot: rows[buffer][slot] for slot in frame_slots}
        output = engine_loop.run_batch(engine, dataclasses.replace(batch, frames=frames))
        conn.send(dataclasses.replace(output, events={}))  # the messages say it all
