"""Per-slot input buffers: the one structure shared by the event loop and the engine thread.

Websocket handlers (event loop) push audio and markers; the engine thread takes at
most one 1920-sample frame per slot per step. Everything goes through one lock and
one condition; every operation is short (no model work under the lock).

A slot's reset (a new stream) is handed to the engine with the slot's first frame or
marker, in the same batch, and every slot reset in one batch is reset in one call.

Each slot has a *generation*, bumped whenever its stream starts or ends. A client's
``Init`` restarts the model row alone, in message order (as moshi-server): after every
whole frame received before it, and before any received after it; the generation,
buffered audio and pending markers stay. The engine thread reports the generation with
every event, so output of an old stream never reaches a new one.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from asrpool.common import protocol

FRAME_SIZE = protocol.FRAME_SIZE


@dataclasses.dataclass
class _SlotInput:
    generation: int = 0
    active: bool = False
    needs_reset: bool = False
    chunks: collections.deque[NDArray[np.float32]] = dataclasses.field(
        default_factory=collections.deque)
    offset: int = 0  # samples of chunks[0] already taken
    samples: int = 0  # buffered samples, not yet handed to the engine
    handed_off: collections.deque[int] = dataclasses.field(
        default_factory=collections.deque)  # sizes of messages being decoded elsewhere
    bytes_handed_off: int = 0
    watched: bool = False  # the event loop waits to hear of hand-offs settled
    held: int | None = None  # its decoder holds pages, having decoded this many samples
    received: int = 0  # samples received since the stream (generation) began
    frames_taken: int = 0  # frames handed to the engine since the stream began
    markers: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (id, frame no.)
    inits: list[int] = dataclasses.field(default_factory=list)  # frame no. each Init is due at
    arrivals: collections.deque[tuple[int, float]] = dataclasses.field(
        default_factory=collections.deque)  # (end sample, monotonic arrival time)

    def clear(self) -> None:
        self.generation += 1
        self.chunks.clear()
        self.offset = self.samples = self.received = self.frames_taken = 0
        self.handed_off.clear()
        self.bytes_handed_off = 0
        self.watched = False
        self.held = None
        self.markers.clear()
        self.inits.clear()
        self.arrivals.clear()

    def pop_frame(self) -> NDArray[np.float32]:
        self.samples -= FRAME_SIZE
        self.frames_taken += 1
        if self.offset == 0 and len(self.chunks[0]) == FRAME_SIZE:  # a frame as sent
            return self.chunks.popleft()
        frame = np.empty(FRAME_SIZE, dtype=np.float32)
        filled = 0
        while filled < FRAME_SIZE:
            chunk = self.chunks[0]
            take = min(FRAME_SIZE - filled, len(chunk) - self.offset)
            frame[filled:filled + take] = chunk[self.offset:self.offset + take]
            filled += take
            self.offset += take
            if self.offset == len(chunk):
                self.chunks.popleft()
                self.offset = 0
        return frame

    def frame_arrival(self) -> float:
        """When the last sample of the next frame arrived (drops older arrivals)."""
        end = (self.frames_taken + 1) * FRAME_SIZE
        while self.arrivals and self.arrivals[0][0] < end:
            self.arrivals.popleft()
        return self.arrivals[0][1] if self.arrivals else time.monotonic()

    def lets_decode(self, decoded: int, cap: int) -> bool:
        """Whether the room the slot would report now (``cap`` less what is buffered) is
        more than what its decoder, having decoded ``decoded`` samples, has sent that is
        not received yet: its credit, once told, would be over 0."""
        return cap - self.samples > decoded - self.received

    def take_inits(self) -> int:
        """How many Inits are due now (every frame received before them is taken)."""
        due = sum(1 for frame in self.inits if frame <= self.frames_taken)
        del self.inits[:due]
        return due

    @property
    def ready(self) -> bool:
        """A frame, a marker or a due Init for the engine. A reset alone is no work: it is
        done with the stream's first frame or marker, so a stream that never sends audio (a
        client that connects and leaves) costs the engine nothing."""
        init_due = bool(self.inits) and self.inits[0] <= self.frames_taken
        return self.active and (bool(self.markers) or init_due or self.samples >= FRAME_SIZE)


Decoded = tuple[int, int, NDArray[np.float32], int]  # slot, generation, audio, hand-offs settled


@dataclasses.dataclass(frozen=True)
class Batch:
    """What the engine thread does next: resets, then markers, then one step."""

    generations: dict[int, int]
    resets: list[int]
    restarts: list[int]  # a slot per Init due: its row resets (unless reset), Ready is sent
    markers: list[tuple[int, int, int]]  # (slot, id, frames pending)
    frames: dict[int, NDArray[np.float32]]
    arrivals: dict[int, float]  # slot -> arrival time of its frame
    buffered: dict[int, int]  # slot -> samples still buffered after this batch


class SlotBuffers:
    def __init__(self, total: int) -> None:
        self._slots = [_SlotInput() for _ in range(total)]
        # A plain lock (C-level enter and exit: no Python frames per call, and some calls
        # come per message); the engine waits on it through the condition.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0  # engine threads waiting on the condition (one, or none)
        self._stopped = False
        self._taken: NDArray[np.int64] | None = None  # samples taken per slot, for intake

    def publish_taken(self, taken: NDArray[np.int64]) -> None:
        """From now on, keep each slot's samples taken by the engine (for the stream in it
        now) in ``taken``: shared memory that intake processes read to hold a client
        back while its slot is full."""
        with self._lock:
            self._taken = taken
            for slot, state in enumerate(self._slots):
                taken[slot] = state.frames_taken * FRAME_SIZE

    @property
    def total(self) -> int:
        return len(self._slots)

    def start(self, slot: int) -> int:
        """A stream starts (or restarts) in ``slot``: empty it, reset it; its new generation."""
        with self._lock:
            state = self._slots[slot]
            state.clear()
            state.active = True
            state.needs_reset = True
            if self._taken is not None:
                self._taken[slot] = 0
            self._wake()
            return state.generation

    def restart(self, slot: int, generation: int | None = None) -> None:
        """``Init``: the engine resets the slot's model row once it has taken every whole
        frame buffered now, before the next one."""
        with self._lock:
            state = self._stream_of(slot, generation)
            if state is None:
                return
            state.inits.append(state.frames_taken + state.samples // FRAME_SIZE)
            self._wake()

    def stop(self, slot: int) -> None:
        """The slot's stream is over: drop whatever it had buffered."""
        with self._lock:
            state = self._slots[slot]
            state.clear()
            state.active = False
            state.needs_reset = False

    def _stream_of(self, slot: int, generation: int | None) -> _SlotInput | None:
        """The slot's input if it still holds that generation's stream (any, if None);
        the caller holds the lock."""
        state = self._slots[slot]
        return state if generation is None or state.generation == generation else None

    def hand_off(self, slot: int, generation: int, size: int) -> tuple[int, int, int] | None:
        """A message of ``size`` bytes of the stream is being decoded elsewhere (an Opus
        lane): the stream's received audio is not all in until the message is settled
        (:meth:`push_audio`). The slot's buffered and received samples and its bytes
        handed off, now (None: the slot holds another stream)."""
        with self._lock:
            state = self._stream_of(slot, generation)
            if state is None:
                return None
            state.handed_off.append(size)
            state.bytes_handed_off += size
            return state.samples, state.received, state.bytes_handed_off

    def drop_hand_offs(self, slot: int, generation: int) -> None:
        """What was handed off will not come (its decoder failed)."""
        with self._lock:
            state = self._stream_of(slot, generation)
            if state is not None:
                state.handed_off.clear()
                state.bytes_handed_off = 0
                state.held = None

    def watch(self, slot: int, generation: int) -> None:
        """:meth:`push_audio` says when it next settles one of the stream's hand-offs."""
        with self._lock:
            state = self._stream_of(slot, generation)
            if state is not None and state.handed_off:
                state.watched = True

    def bytes_handed_off(self, slot: int, generation: int) -> int:
        with self._lock:
            state = self._stream_of(slot, generation)
            return 0 if state is None else state.bytes_handed_off

    def unsettled(self) -> list[tuple[int, int]]:
        """(slot, generation) of every stream with a hand-off not settled."""
        with self._lock:
            return [(slot, state.generation) for slot, state in enumerate(self._slots)
                    if state.handed_off]

    def hold(self, slot: int, generation: int, decoded: int, cap: int) -> bool:
        """The stream's decoder holds its pages for want of room, having decoded
        ``decoded`` samples; whether the slot's room, with its buffer capped at ``cap``,
        already lets it decode more (:meth:`rooms_due` would list it)."""
        with self._lock:
            state = self._stream_of(slot, generation)
            if state is None:
                return False
            state.held = decoded
            return state.lets_decode(decoded, cap)

    def rooms_due(self, cap: int, among: Iterable[int] | None = None) -> list[tuple[int, int]]:
        """(slot, generation) of every stream (of the slots ``among``, or any) whose
        decoder holds pages for want of room and whose room now lets it decode more.
        Each hold is listed once: a decoder that holds again says so again."""
        with self._lock:
            due = []
            for slot in range(len(self._slots)) if among is None else among:
                state = self._slots[slot]
                if state.held is not None and state.lets_decode(state.held, cap):
                    state.held = None
                    due.append((slot, state.generation))
            return due

    def push_audio(self, slot: int, pcm: NDArray[np.float32]) -> None:
        """Audio for the slot's stream."""
        with self._lock:
            state = self._slots[slot]
            if len(pcm):
                self._append(state, pcm, time.monotonic())
                if state.samples >= FRAME_SIZE:
                    self._wake()

    def push_decoded(self, decoded: list[Decoded]) -> list[tuple[int, int]]:
        """Audio decoded elsewhere for streams, in one go (an Opus lane's answers), each
        with how many of its stream's hand-offs it settles; a decoder's late answer never
        reaches the slot's next stream. The streams whose event loop waits to hear of
        their hand-offs settled."""
        woken = []
        now = time.monotonic()
        with self._lock:
            for slot, generation, pcm, settled in decoded:
                state = self._stream_of(slot, generation)
                if state is None:
                    continue
                if settled and self._settle(state, settled):
                    woken.append((slot, generation))
                if len(pcm):
                    self._append(state, pcm, now)
            self._wake()
        return woken

    @staticmethod
    def _append(state: _SlotInput, pcm: NDArray[np.float32], now: float) -> None:
        state.chunks.append(pcm)
        state.samples += len(pcm)
        state.received += len(pcm)
        state.arrivals.append((state.received, now))

    @staticmethod
    def _settle(state: _SlotInput, settled: int) -> bool:
        """``settled`` hand-offs are in; whether the event loop waited for that."""
        for _ in range(min(settled, len(state.handed_off))):
            state.bytes_handed_off -= state.handed_off.popleft()
        watched, state.watched = state.watched, False
        return watched

    def push_marker(self, slot: int, marker_id: int, generation: int | None = None) -> None:
        """Due after every full frame buffered now (the frame number, counted per stream)."""
        with self._lock:
            state = self._stream_of(slot, generation)
            if state is None:
                return
            state.markers.append((marker_id, state.frames_taken + state.samples // FRAME_SIZE))
            self._wake()

    def buffered(self, slot: int) -> int:
        """Samples received and not yet taken by the engine."""
        with self._lock:
            return self._slots[slot].samples

    def buffered_and_received(self, slot: int) -> tuple[int, int]:
        """:meth:`buffered` and :meth:`received` at one instant."""
        with self._lock:
            state = self._slots[slot]
            return state.samples, state.received

    def decoding(self, slot: int) -> int:
        """Messages of the slot's stream handed off and not wholly in yet."""
        with self._lock:
            return len(self._slots[slot].handed_off)

    def generation(self, slot: int) -> int:
        with self._lock:
            return self._slots[slot].generation

    def taken(self, slot: int) -> int:
        """Frames of the slot's stream handed to the engine so far."""
        with self._lock:
            return self._slots[slot].frames_taken

    def received(self, slot: int) -> int:
        with self._lock:
            return self._slots[slot].received

    def being_decoded(self) -> int:
        """Messages handed off in every slot and not wholly in yet (Opus lanes)."""
        with self._lock:
            return sum(len(state.handed_off) for state in self._slots)

    def buffered_total(self) -> int:
        with self._lock:
            return sum(state.samples for state in self._slots)

    def close(self) -> None:
        with self._lock:
            self._stopped = True
            self._cond.notify_all()

    def pending(self) -> bool:
        """Some slot has a frame or a marker for the engine."""
        with self._lock:
            return any(state.ready for state in self._slots)

    def take(self, timeout: float = 0.5, wait: bool = True) -> Batch | None:
        """The work some slot has, once it has some (``wait``), or now; None once closed,
        or when there is none and not ``wait`` (engine thread only)."""
        with self._lock:
            while wait and not self._stopped and not self._has_work():
                self._waiting += 1
                try:
                    self._cond.wait(timeout)
                finally:
                    self._waiting -= 1
            if self._stopped or not self._has_work():
                return None
            return self._take_locked()

    def _wake(self) -> None:
        """Wake the engine thread if it waits (the caller holds the lock): a notify
        costs a message four times the lock itself, and a busy engine never waits."""
        if self._waiting:
            self._cond.notify()

    def _has_work(self) -> bool:
        return any(state.ready for state in self._slots)

    def _take_locked(self) -> Batch:
        generations: dict[int, int] = {}
        resets: list[int] = []
        restarts: list[int] = []
        markers: list[tuple[int, int, int]] = []
        frames: dict[int, NDArray[np.float32]] = {}
        arrivals: dict[int, float] = {}
        buffered: dict[int, int] = {}
        for slot, state in enumerate(self._slots):
            if not state.ready:
                continue
            generations[slot] = state.generation
            if state.needs_reset:
                resets.append(slot)
                state.needs_reset = False
            if state.inits:
                restarts.extend([slot] * state.take_inits())
            if state.markers:
                markers.extend((slot, mid, due - state.frames_taken)
                               for mid, due in state.markers)
                state.markers.clear()
            if state.samples >= FRAME_SIZE:
                arrivals[slot] = state.frame_arrival()
                frames[slot] = state.pop_frame()
                if self._taken is not None:
                    self._taken[slot] = state.frames_taken * FRAME_SIZE
            buffered[slot] = state.samples
        return Batch(generations, resets, restarts, markers, frames, arrivals, buffered)
