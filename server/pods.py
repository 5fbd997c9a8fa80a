"""The pod: everything one server process holds, built once and passed to the app.

:class:`Pod` ties the slot buffers, the engine thread, the streams, the heartbeat and
the metrics together, and answers the questions the routes ask (is the pod ready? may
it take a stream?); who may connect at all is its :class:`gate.Gate`'s to say, and
keeping real time its :class:`keeping.Keeper`'s. It holds no module-level state.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import sys
import time
from typing import TYPE_CHECKING

import redis.asyncio as aioredis

from asrpool.common import auth, heap, protocol, registry
from asrpool.server import (
    engine_loop,
    enginechild,
    gate,
    handles,
    heartbeat,
    intake,
    keeping,
    metrics,
    opuslanes,
    outcomes,
    overload,
    sessions,
    settings,
    slots,
)

if TYPE_CHECKING:
    from asrpool.server import pacing, sizing

logger = logging.getLogger(__name__)


class State(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


@dataclasses.dataclass
class Deps:
    """What a pod needs from outside: built by :func:`app.build_deps` or by a test."""

    engine_factory: engine_loop.EngineFactory
    redis: aioredis.Redis | None = None
    keys: auth.KeyRing | None = None
    sizing: sizing.Sizing | None = None  # how --batch-size auto chose the pod's slots


class Pod:
    def __init__(self, config: settings.ServerSettings, deps: Deps) -> None:
        self.settings = config
        self.deps = deps
        self.metrics = metrics.ServerMetrics()
        self.buffers = slots.SlotBuffers(config.slots)
        self.sessions = sessions.Sessions(
            self.buffers, config.resume_grace_seconds, config.max_pending_messages,
            self._slots_changed)
        self.state = State.LOADING
        self.model_id = config.model
        self.pace: pacing.Pace | None = None  # a paced stand-in's, once it is ready
        self.delay = 0  # the model's steps from a frame to its word, once it is ready
        self.voice_activity = False  # whether its Steps say when the speaker pauses
        self.failure: BaseException | None = None
        self.instance = registry.new_instance()  # this process, among pods of one id
        self.stopped = asyncio.Event()  # set when the process should exit (drained/failed)
        self._heartbeat_wake = asyncio.Event()
        self.realtime = overload.RealTimeWatch(config.overload_seconds, config.shed_seconds)
        self.keeper = keeping.Keeper(self.realtime, self.sessions, self.metrics,
                                     self._heartbeat_wake.set)
        self.gate = gate.Gate(config, deps.keys, self.count_error)  # 401 and 429
        self._engine: engine_loop.EngineLoop | None = None
        self.lanes: opuslanes.OpusLanes | None = None
        self.intake: intake.IntakeWorkers | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.metrics.slots_total.set(config.slots)
        self.metrics.slots_free.set(config.slots)
        if deps.sizing is not None:
            self.metrics.auto_step.set(deps.sizing.step_p99_ms / 1e3)

    # Life cycle.

    async def start(self) -> None:
        if self.deps.redis is not None:
            try:
                await heartbeat.claim_at_start(self.deps.redis, self.settings.pool,
                                               self.settings.pod_id, self.instance,
                                               self.settings.heartbeat_lease_ms)
            except registry.PodIdTaken as exc:
                logger.error("cannot start: %s", exc)
                self.failure = exc
                self.state = State.FAILED
                self.stopped.set()
                return
        loop = asyncio.get_running_loop()
        self._engine = engine_loop.EngineLoop(
            lambda: self._open_runner(loop), self.buffers, loop, self._on_output, self._on_ready,
            self._on_failure)
        self._engine.start()
        if self.settings.opus_workers:
            self.lanes = opuslanes.OpusLanes(
                self.settings.opus_workers, self.buffers, self.settings.max_buffer_samples,
                loop, self._opus_failed, self._opus_settled)
        if self.settings.intake_processes:
            self.intake = intake.IntakeWorkers(
                self.settings.intake_processes, self.buffers, self.settings, loop,
                lambda _: self.metrics.intake_restarts.inc())
        if self.deps.redis is not None:
            self._tasks.append(asyncio.create_task(self._heartbeat(self.deps.redis)))
        self._tasks.append(asyncio.create_task(self.keeper.run()))

    async def shutdown(self) -> None:
        for stream in self.sessions.streams():
            self.sessions.close(stream)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.deps.redis is not None:
            await heartbeat.withdraw(self.deps.redis, self.settings.pod_id, self.settings.pool,
                                     self.instance)
            await self.deps.redis.aclose()
        if self._engine is not None:
            await asyncio.to_thread(self._engine.stop)
        if self.lanes is not None:
            await asyncio.to_thread(self.lanes.close)
        if self.intake is not None:
            self.intake.close()
            await asyncio.to_thread(self.intake.wait)

    def _open_runner(self, loop: asyncio.AbstractEventLoop) -> engine_loop.Runner:
        """The engine in its own process (``--engine-process``: the settings name the
        model) or in the engine thread (the model ``deps`` builds)."""
        if self.settings.in_engine_process:
            return enginechild.ChildRunner(
                enginechild.EngineSpec.of(self.settings), self.settings.warmup_steps,
                on_exit=lambda exc: loop.call_soon_threadsafe(self._on_failure, exc),
                in_flight=self.settings.engine_batches_in_flight)
        return engine_loop.InProcess(self.deps.engine_factory, self.settings.warmup_steps)

    def begin_drain(self) -> bool:
        """Stop taking streams now; False if the pod was not serving (nothing to drain)."""
        if self.state is not State.READY:
            self.stopped.set()
            return False
        self.state = State.DRAINING
        self.metrics.draining.set(1)
        self._heartbeat_wake.set()
        logger.info("draining: %d open streams", self.sessions.used)
        return True

    # Questions the routes ask (who may connect at all: self.gate).

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    @property
    def started(self) -> bool:
        """The model is loaded and warmed: serving now, or draining after serving."""
        return self.state in (State.READY, State.DRAINING)

    def not_accepting(self) -> outcomes.Failed | None:
        """Why a new stream is refused after the upgrade, or None."""
        if self.state is State.DRAINING:
            return outcomes.Failed("server is draining", protocol.ErrorCode.DRAINING,
                                   protocol.CloseCode.TRY_AGAIN)
        if self.state is not State.READY:
            return outcomes.busy("model is still loading")
        if self.realtime.overloaded:
            return outcomes.busy(
                f"server is {self.realtime.behind:.1f} s behind real time: no new streams "
                "until it catches up")
        return None

    def open(self, resumable: bool) -> handles.Handle | outcomes.Failed:
        """A new stream in a free slot, or why not."""
        refused = self.not_accepting()
        if refused is not None:
            return refused
        stream = self.sessions.open(resumable)
        return outcomes.busy() if stream is None else self._handle(stream)

    async def reclaim(self, token: str) -> handles.Handle | outcomes.Failed:
        """The stream a resume token names, taken over from any older connection."""
        stream = await self.sessions.reclaim(token)
        if stream is None:
            return outcomes.Failed("unknown or expired resume token",
                                   protocol.ErrorCode.BAD_RESUME_TOKEN)
        stream.resumable = True
        return self._handle(stream)

    def end(self, token: str) -> bool:
        """End the stream a resume token names now (``DELETE /api/asr-streaming``)."""
        return self.sessions.end(token)

    def _handle(self, stream: sessions.Stream) -> handles.Handle:
        return handles.Handle(stream, self.sessions, self.buffers, self.metrics, self.settings,
                              self.lanes)

    def count_error(self, code: protocol.ErrorCode) -> None:
        self.metrics.errors.labels(code).inc()

    def modules_info(self) -> list[dict[str, str]]:
        """moshi-server's shape (a list of modules, every value a string), plus
        ``model`` and ``draining``, and ``paced`` where a paced stand-in serves."""
        module = {"type": "batched_asr", "path": protocol.STREAMING_PATH,
                  "lm": self.model_id, "audio_tokenizer": self.model_id,
                  "used_slots": str(self.sessions.used), "total_slots": str(self.sessions.total),
                  "model": self.model_id, "draining": str(self.state is State.DRAINING).lower(),
                  "overloaded": str(self.realtime.overloaded).lower()}
        if self.deps.sizing is not None:
            module["auto_batch_size"] = self.deps.sizing.describe()
        return [module if self.pace is None else module | {"paced": self.pace.label}]

    def beat(self) -> registry.PodHeartbeat:
        """An overloaded pod's routers admit no new stream to it, as to a draining one."""
        return registry.PodHeartbeat(
            pod_id=self.settings.pod_id, pool=self.settings.pool,
            address=self.settings.address, total_slots=self.sessions.total,
            free_slots=self.sessions.total - self.sessions.used,
            draining=self.state is State.DRAINING, model=self.model_id,
            overloaded=self.realtime.overloaded)

    # Callbacks from the engine thread (run on the event loop).

    def _on_ready(self, ready: engine_loop.Ready) -> None:
        self.model_id = ready.model_id
        self.delay = ready.delay
        self.voice_activity = ready.voice_activity
        self.pace = ready.pace
        if ready.pace is not None:
            self.metrics.paced_engine.labels(ready.model_id, ready.pace.measured_on).set(1)
        if self.state is State.LOADING:
            self.state = State.READY
            heap.freeze_startup_objects()  # the model is loaded and warm: see common.heap
        self._heartbeat_wake.set()
        logger.info("ready: model %s, %s, streaming state %.1f MiB, messages %s, the engine "
                    "in %s, GIL switch %g ms", _model_of(ready), self._slots_said(),
                    ready.state_nbytes / 2**20,
                    f"in {self.settings.intake_processes} intake processes"
                    if self.settings.intake_processes else "on the event loop",
                    "a child process" if self.settings.in_engine_process else "a thread",
                    sys.getswitchinterval() * 1e3)

    def _slots_said(self) -> str:
        sized = self.deps.sizing
        auto = "" if sized is None else f" (--batch-size auto: {sized.describe()})"
        return f"{self.sessions.total} slots{auto}"

    def _on_failure(self, exc: BaseException) -> None:
        logger.error("engine failed: %s", exc)
        self.failure = exc
        self.state = State.FAILED
        self.stopped.set()

    def _on_output(self, output: engine_loop.StepOutput) -> None:
        self.sessions.deliver(output)
        self.keeper.judge(self.realtime.step(time.monotonic(), output.buffered,
                                             output.duration, self.sessions.used))
        if self.lanes is not None:
            self.lanes.after_step()
        if self.intake is not None:
            self.intake.after_step()
        m = self.metrics
        if output.duration:
            m.model_step_duration.observe(output.duration)
            if self.settings.in_engine_process:
                m.engine_handover.observe(output.handover)
            m.batch_rows.observe(len(output.lags))
            m.audio_seconds.inc(len(output.lags) * protocol.FRAME_SIZE / protocol.SAMPLE_RATE)
        for lag in output.lags.values():
            m.step_lag.observe(lag)
        m.buffered_audio.set(self.buffers.buffered_total() / protocol.SAMPLE_RATE)

    def _opus_failed(self, slot: int, generation: int, reason: str) -> None:
        """An Opus lane could not decode a stream's page: that stream ends (bad_audio)."""
        stream = self.sessions.in_slot(slot, generation)
        if stream is None:
            return
        failed = outcomes.Failed(reason, protocol.ErrorCode.BAD_AUDIO)
        if stream.attached:
            stream.end_connection(failed)
        else:
            self.sessions.close(stream)

    def _opus_settled(self, slot: int, generation: int) -> None:
        """An Opus lane decoded messages a stream's connection waits on: it looks again."""
        stream = self.sessions.in_slot(slot, generation)
        if stream is not None:
            stream.room.set()

    def _slots_changed(self) -> None:
        self.metrics.slots_free.set(self.sessions.total - self.sessions.used)
        self._heartbeat_wake.set()

    async def _heartbeat(self, redis: aioredis.Redis) -> None:
        lease_ms = self.settings.heartbeat_lease_ms
        while self.state is State.LOADING:
            await heartbeat.hold(redis, self.settings.pool, self.settings.pod_id,
                                 self.instance, lease_ms)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._heartbeat_wake.wait(), 0.5)
            self._heartbeat_wake.clear()
        if self.state is State.FAILED:
            return
        await heartbeat.run(redis, self.beat, self.settings.heartbeat_interval_seconds,
                            lease_ms, self._heartbeat_wake, self.instance,
                            announce=self.settings.announce_pool)


def _model_of(ready: engine_loop.Ready) -> str:
    """The ready line's model: its id, or what a paced stand-in stands in for."""
    pace = ready.pace
    if pace is None:
        return ready.model_id
    return (f"{ready.model_id} PACED (a stand-in, no model runs: {pace.step_ms:.2f} ms per "
            f"step from the {pace.measured_on} bench capacity)")
