"""Streams and their slots, on the event loop: open, attach, detach for a resume, close.

A :class:`Stream` holds one slot from its first ``Ready`` until it ends. While its
client is attached, a writer task sends its outbox; after a lost connection of a client
that asked to resume (``asrpool-resumable: 1``; the router always does) it stays,
detached, for the resume grace period: the engine keeps working through its
buffered audio and the results wait in the (bounded) outbox for a reconnect with its
resume token.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import secrets
import uuid
from collections.abc import Callable

from asrpool.common import protocol
from asrpool.server import engine_loop, inputs, outcomes, slots

HISTORY = 512  # sent messages kept per stream, to replay what a dropped connection lost


@dataclasses.dataclass(eq=False)
class Stream:
    slot: int
    generation: int
    session_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    resume_token: str = dataclasses.field(default_factory=lambda: secrets.token_urlsafe(24))
    outbox: collections.deque[bytes] = dataclasses.field(default_factory=collections.deque)
    has_output: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    room: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    resumable: bool = False  # kept for the grace after a lost connection
    ended: bool = False  # its end was asked for (DELETE): never kept for a resume
    input: inputs.StreamInput = dataclasses.field(default_factory=inputs.StreamInput)
    attached: bool = False
    kick: asyncio.Future[outcomes.Outcome] | None = None
    detached: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    expiry: asyncio.TimerHandle | None = None
    sent: int = 0  # messages of this stream sent so far (not counting the Ready of an attach)
    markers_waiting: int = 0  # markers pushed whose Marker has not come back yet
    frames_done: int = 0  # frames of this stream the engine stepped, their results posted
    history: collections.deque[bytes] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=HISTORY))

    # The attached connection's writer, when it can send at once (``Handle.write_through``).
    direct: Callable[[list[bytes]], bool] | None = None

    def post_all(self, messages: list[bytes]) -> None:
        """Queue the messages for the writer task, or, with nothing queued before them,
        send them at once through the connection's own protocol (no task woken)."""
        if not self.outbox and self.direct is not None and self.direct(messages):
            self.history.extend(messages)
            self.sent += len(messages)
            return
        self.outbox.extend(messages)
        self.has_output.set()

    def mark_sent(self) -> None:
        self.history.append(self.outbox.popleft())
        self.sent += 1

    def replay_from(self, received: int) -> int:
        """Queue again what was sent after the client's ``received``-th message
        (lost in flight when the connection dropped); how many could be replayed."""
        if received > self.sent:  # the client got messages the writer had not counted yet
            for _ in range(min(received - self.sent, len(self.outbox))):
                self.mark_sent()
            return 0
        lost = min(self.sent - received, len(self.history))
        if lost <= 0:
            return 0
        replay = [self.history.pop() for _ in range(lost)]
        self.outbox.extendleft(replay)  # popped newest first, so extendleft restores order
        self.sent -= lost
        self.has_output.set()
        return lost

    def end_connection(self, outcome: outcomes.Outcome) -> None:
        """Ask the attached connection to end (drain, takeover, overflow)."""
        if self.kick is not None and not self.kick.done():
            self.kick.set_result(outcome)


class Sessions:
    def __init__(self, buffers: slots.SlotBuffers, resume_grace: float, max_pending: int,
                 on_change: Callable[[], None]) -> None:
        self._buffers = buffers
        self._grace = resume_grace
        self._max_pending = max_pending
        self._on_change = on_change
        self._streams: dict[int, Stream] = {}
        self._tokens: dict[str, Stream] = {}

    @property
    def total(self) -> int:
        return self._buffers.total

    @property
    def used(self) -> int:
        return len(self._streams)

    @property
    def attached(self) -> int:
        return sum(stream.attached for stream in self._streams.values())

    def streams(self) -> list[Stream]:
        return list(self._streams.values())

    def newest(self, count: int) -> list[Stream]:
        """The ``count`` streams opened last (a resumed stream keeps its place)."""
        return list(self._streams.values())[-count:] if count > 0 else []

    def in_slot(self, slot: int, generation: int) -> Stream | None:
        """The stream of that generation in the slot, if it is still there."""
        stream = self._streams.get(slot)
        return stream if stream is not None and stream.generation == generation else None

    def open(self, resumable: bool = False) -> Stream | None:
        """A new stream in the lowest free slot, or None when all are taken."""
        free = next((s for s in range(self.total) if s not in self._streams), None)
        if free is None:
            return None
        stream = Stream(slot=free, generation=self._buffers.start(free), resumable=resumable)
        self._streams[free] = stream
        self._tokens[stream.resume_token] = stream
        self._on_change()
        return stream

    async def reclaim(self, token: str) -> Stream | None:
        """The stream a resume token names, once no other connection holds it."""
        stream = self._tokens.get(token)
        if stream is None:
            return None
        while stream.attached:  # the old connection may not know yet that it is dead
            stream.end_connection(outcomes.Replaced())
            await stream.detached.wait()
        if self._tokens.get(token) is not stream:
            return None
        if stream.expiry is not None:
            stream.expiry.cancel()
            stream.expiry = None
        self._claim(stream)  # now, not after the handshake: a second resume waits for us
        return stream

    def end(self, token: str) -> bool:
        """End the stream a resume token names now, as if its client had closed: an
        attached connection is asked to end (``Closed``), a detached stream's slot is
        freed. The request is kept on the stream, so that however its connection is
        then seen to end (lost, as the router dropped it, before or after this), the
        slot is freed, never held for a resume. False when the token names none."""
        stream = self._tokens.get(token)
        if stream is None:
            return False
        stream.ended = True
        if stream.attached:
            stream.end_connection(outcomes.Closed())
        else:
            self.close(stream)
        return True

    def _claim(self, stream: Stream) -> None:
        stream.attached = True
        stream.detached.clear()
        stream.kick = asyncio.get_running_loop().create_future()

    def attach(self, stream: Stream) -> asyncio.Future[outcomes.Outcome]:
        """The connection is up; a resumed stream keeps the claim taken by
        :meth:`reclaim` (a newer resume may already have asked it to end)."""
        if stream.kick is None:
            self._claim(stream)
        stream.has_output.set()
        assert stream.kick is not None
        return stream.kick

    def restart(self, stream: Stream) -> None:
        """``Init``, as moshi-server, in message order: the model row is reset after the
        audio received before it, and ``Ready`` comes in the stream's events there;
        buffered audio, pending markers and queued results stay."""
        self._buffers.restart(stream.slot)

    def finish(self, stream: Stream, outcome: outcomes.Outcome) -> None:
        """The connection is gone: keep a resumable stream for a resume, or end it."""
        stream.attached = False
        stream.kick = None
        stream.detached.set()
        if isinstance(outcome, outcomes.Replaced):
            return
        if self._held_for_resume(stream, outcome):
            loop = asyncio.get_running_loop()
            stream.expiry = loop.call_later(self._grace, self.close, stream)
            return
        self.close(stream)

    def _held_for_resume(self, stream: Stream, outcome: outcomes.Outcome) -> bool:
        """Only a lost connection of a stream that asked to resume, and whose end was
        not asked for, is held."""
        return (isinstance(outcome, outcomes.Lost) and stream.resumable and not stream.ended
                and self._grace > 0)

    def close(self, stream: Stream) -> None:
        if self._streams.get(stream.slot) is not stream:
            return
        if stream.expiry is not None:
            stream.expiry.cancel()
        del self._streams[stream.slot]
        self._tokens.pop(stream.resume_token, None)
        self._buffers.stop(stream.slot)
        stream.end_connection(outcomes.Failed("stream closed", protocol.ErrorCode.INTERNAL))
        self._on_change()

    def deliver(self, output: engine_loop.StepOutput) -> None:
        """Route one step's events to their streams (events of ended streams are dropped)."""
        for slot, generation in output.generations.items():
            stream = self._streams.get(slot)
            if stream is None or stream.generation != generation:
                continue
            stream.frames_done += slot in output.lags  # a slot has a lag when it stepped
            stream.markers_waiting -= output.markers.get(slot, 0)
            messages = output.messages.get(slot)
            if messages:
                stream.post_all(messages)
            stream.room.set()
            if len(stream.outbox) > self._max_pending:
                self._overflow(stream)

    def _overflow(self, stream: Stream) -> None:
        if stream.attached:
            stream.end_connection(outcomes.Failed(
                "too many results waiting: the client does not read them",
                protocol.ErrorCode.TOO_SLOW))
        else:
            self.close(stream)
