"""One stream as its connection sees it: the one seam between a handler and the pod.

The websocket handler (and ``POST /api/asr-streaming``) holds a :class:`Handle` and
never reaches into the pod's buffers, sessions or metrics: it pushes client messages,
asks how much is buffered or was received, waits for room (backpressure) and for
output, and finishes with an :data:`outcomes.Outcome`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import numpy as np
from numpy.typing import NDArray

from asrpool.common import protocol
from asrpool.server import metrics, opuslanes, outcomes, sessions, settings, slots

_DECODE_IN_LOOP = 64 << 10  # larger OggOpus messages are decoded in a thread


@dataclasses.dataclass(frozen=True)
class Connected:
    """A connection's reader and writer on its stream, and the pod's word to end it."""

    reader: asyncio.Task[outcomes.Outcome]
    writer: asyncio.Task[None]
    kick: asyncio.Future[outcomes.Outcome]


@contextlib.asynccontextmanager
async def connected(handle: Handle, resumed: bool,
                    reader: Coroutine[Any, Any, outcomes.Outcome],
                    writer: Coroutine[Any, Any, None]) -> AsyncIterator[Connected]:
    """Attach, run the reader and the writer, and yield once the first of them or the
    pod's kick is done; on the way out detach and stop both (each protocol's handler
    decides meanwhile how the stream ended)."""
    kick = handle.attach(resumed)
    tasks = Connected(asyncio.create_task(reader), asyncio.create_task(writer), kick)
    try:
        waited: set[asyncio.Future[Any]] = {tasks.reader, tasks.writer, kick}
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        yield tasks
    finally:
        handle.detach()
        for task in (tasks.reader, tasks.writer):
            task.cancel()
        await asyncio.gather(tasks.reader, tasks.writer, return_exceptions=True)


class Handle:
    def __init__(self, stream: sessions.Stream, streams: sessions.Sessions,
                 buffers: slots.SlotBuffers, meters: metrics.ServerMetrics,
                 config: settings.ServerSettings,
                 lanes: opuslanes.OpusLanes | None = None) -> None:
        self._stream = stream
        self._sessions = streams
        self._buffers = buffers
        self._meters = meters
        self._cap = config.max_buffer_samples
        self._max_markers = config.max_pending_markers
        self._lanes = lanes
        self._lane_maybe_full = True  # the stream's lane may hold its most: look before sending

    @property
    def session_id(self) -> str:
        return self._stream.session_id

    @property
    def slot(self) -> int:
        return self._stream.slot

    @property
    def generation(self) -> int:
        return self._stream.generation

    def kind(self) -> str | None:
        """The stream's kind of audio, once its first audio message fixed it."""
        return self._stream.input.kind

    def claim(self, kind: str) -> None:
        """The stream sends ``kind`` of audio (checked by an intake process)."""
        self._stream.input.claim(kind)

    @property
    def resume_token(self) -> str:
        return self._stream.resume_token

    def received(self) -> int:
        """Samples of this stream the pod has received (the resume offset)."""
        return self._buffers.received(self._stream.slot)

    def buffered(self) -> int:
        """Samples waiting for the engine."""
        return self._buffers.buffered(self._stream.slot)

    def replay_from(self, received: int) -> int:
        return self._stream.replay_from(received)

    def waiting(self) -> int:
        return len(self._stream.outbox)

    # Input.

    async def push(self, message: protocol.ClientMessage) -> None:
        """Take one client message; raises :class:`protocol.ProtocolError`."""
        if message["type"] == "Marker":
            self.push_marker(message["id"])
        elif message["type"] == "Init":
            self.restart()
        elif message["type"] == "OggOpus":
            await self._push_opus(message["data"])
        else:
            self.push_audio(self._stream.input.pcm(message))

    async def _push_opus(self, data: bytes) -> None:
        """Decoded only as far as the slot's buffer has room; the rest waits, still
        encoded, for room (the connection is not read meanwhile, as for PCM)."""
        if self._lanes is not None:
            await self._queue_opus(data, self._lanes)
            return
        opus = self._stream.input.opus_decoder()
        while True:
            room = max(self._cap - self.buffered(), 0)
            if len(data) + opus.pending > _DECODE_IN_LOOP:
                # Seconds of Opus take a while to decode: not on the event loop. The
                # message is awaited before the next one, so the decoder has one user.
                pcm = await asyncio.to_thread(opus.decode, data, room)
            else:
                pcm = opus.decode(data, room)
            self.push_audio(pcm)
            if not opus.pending:
                return
            data = b""
            await self.room()

    async def _queue_opus(self, data: bytes, lanes: opuslanes.OpusLanes) -> None:
        """Handed, as it came, to the slot's lane, which decodes no more than the slot's
        buffer has room for and holds the rest, still encoded; the connection is not
        read while the lane holds much of the stream's bytes."""
        stream = self._stream
        stream.input.claim("OggOpus")
        if self._lane_maybe_full:  # only settling empties a lane: else not full now
            while self._lane_full():
                await self._changed(self._lane_full)
        self._lane_maybe_full = lanes.lane(stream.slot).send_data(
            stream.slot, stream.generation, data)

    def _lane_full(self) -> bool:
        lane = self._lane_of_opus()
        return lane is not None and lane.full(self._stream.slot, self._stream.generation)

    def _lane_of_opus(self) -> opuslanes.Lane | None:
        """The lane an Opus stream's markers and Inits go through (behind its pages)."""
        if self._lanes is None or self._stream.input.kind != "OggOpus":
            return None
        return self._lanes.lane(self._stream.slot)

    def push_marker(self, marker_id: int) -> None:
        stream = self._stream
        if stream.markers_waiting >= self._max_markers:
            raise protocol.ProtocolError(
                f"{stream.markers_waiting} markers are waiting for their audio; at most "
                f"{self._max_markers} may (send audio after a marker)",
                protocol.ErrorCode.TOO_MANY_MARKERS)
        stream.markers_waiting += 1
        lane = self._lane_of_opus()
        if lane is not None:
            lane.send_marker(stream.slot, stream.generation, marker_id)
        else:
            self._buffers.push_marker(stream.slot, marker_id)

    def push_audio(self, pcm: NDArray[np.float32]) -> None:
        self._buffers.push_audio(self._stream.slot, pcm)

    def takes_audio_now(self) -> bool:
        """Whether an ``Audio`` message may be pushed at once (:meth:`push_audio_now`):
        the stream sends PCM and its slot has room, as :meth:`room` would find."""
        return self._stream.input.kind != "OggOpus" and self.buffered() < self._cap

    def push_audio_now(self, message: protocol.AudioMessage) -> None:
        """An ``Audio`` message, pushed as :meth:`push` would (after :meth:`takes_audio_now`)."""
        self.push_audio(self._stream.input.pcm(message))

    def restart(self) -> None:
        lane = self._lane_of_opus()
        if lane is not None:
            lane.send_init(self._stream.slot, self._stream.generation)
        else:
            self._sessions.restart(self._stream)

    async def room(self) -> None:
        """Backpressure: return once the slot's buffer is under its cap."""
        stream = self._stream
        while self.buffered() >= self._cap:
            stream.room.clear()
            if self.buffered() >= self._cap:
                await stream.room.wait()

    def processed(self) -> bool:
        """Whether the engine has stepped every whole frame received, its results posted
        (an Opus lane has every message of the stream decoded)."""
        slot = self._stream.slot
        taken = self._buffers.taken(slot)
        return (self.buffered() < protocol.FRAME_SIZE and not self._buffers.decoding(slot)
                and self._stream.frames_done >= taken)

    async def all_processed(self) -> None:
        """Return once :meth:`processed` (the caller bounds the wait)."""
        def waiting() -> bool:
            return not self.processed()

        while waiting():
            await self._changed(waiting)

    async def _changed(self, waiting: Callable[[], bool]) -> None:
        """Wait, while ``waiting()``, for the stream's next step results or for its lane
        to settle messages."""
        stream = self._stream
        stream.room.clear()  # set with every step's results, and by the lane
        lane = self._lane_of_opus()
        if lane is not None and self._buffers.decoding(stream.slot):
            self._buffers.watch(stream.slot, stream.generation)
            lane.send_room(stream.slot, stream.generation)  # it answers with all it has
        if waiting():
            await stream.room.wait()

    # Output.

    async def next_output(self) -> bytes:
        """The next message to send (it stays queued until :meth:`sent`)."""
        stream = self._stream
        while not stream.outbox:
            stream.has_output.clear()
            await stream.has_output.wait()
        return stream.outbox[0]

    def sent(self) -> None:
        self._stream.mark_sent()

    def write_through(self, send: Callable[[list[bytes]], bool] | None) -> None:
        """From now on (None: no more), results with nothing queued before them are
        sent at once by ``send`` (False when it cannot send now: they are queued)."""
        self._stream.direct = send

    def take_waiting(self) -> list[bytes]:
        """The results waiting, counted as sent: an intake process sends them."""
        stream = self._stream
        waiting = list(stream.outbox)
        while stream.outbox:
            stream.mark_sent()
        return waiting

    def take_pending(self) -> list[bytes]:
        pending = list(self._stream.outbox)
        self._stream.outbox.clear()
        return pending

    # The connection's life.

    def attach(self, resumed: bool) -> asyncio.Future[outcomes.Outcome]:
        """The connection is up: the future is set when the pod ends it (drain, takeover,
        overflow)."""
        self._meters.connect.inc()
        if resumed:
            self._meters.resumes.inc()
        self._meters.open_channels.inc()
        return self._sessions.attach(self._stream)

    def detach(self) -> None:
        self._meters.open_channels.dec()

    def finish(self, outcome: outcomes.Outcome) -> None:
        self._sessions.finish(self._stream, outcome)
