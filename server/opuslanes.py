"""Opus decoded beside the event loop: a pod's lanes to its decoding children.

With ``--opus-workers N`` (N > 0) a stream's ``OggOpus`` messages are handed, bytes as
they came, to one of N child processes (:mod:`opusworker`; slot ``s`` to child
``s % N``), which frame, check, weigh and decode them in parallel, outside the pod's
GIL. The event loop only queues bytes: a writer thread per lane batches what was queued
into one pipe write, and a reader thread per lane puts each answer straight into the
slot's buffer (:class:`slots.SlotBuffers` is thread-safe).

Nothing is decoded past a slot's room: each message carries the room the slot had when
it was sent, the child decodes while that room lasts and holds the rest, still encoded,
and says so (``HELD``, with how much it has decoded). The pod reports the room again
(``ROOM``) once it lets that stream decode more: looked at after every engine step
(:meth:`OpusLanes.after_step`) and when the word comes, so the child hears of the room
however late the event loop runs a step's callback (the engine does not wait for it).
Every record to a child is sent from the event loop, so records keep the order of the
room they carry. A message counts as received but not yet in
(:meth:`slots.SlotBuffers.hand_off`) until its child says it is wholly decoded, so
"every result of the audio received" holds; and a stream stops being read while
:data:`MAX_BYTES_IN_FLIGHT` of its bytes wait in its child (:meth:`Lane.full`). A
stream's markers and ``Init`` go through its lane too, so they land after the audio sent
before them. Bytes the child cannot frame or decode end their stream (``bad_audio``),
through ``on_failure`` on the event loop; a child that dies ends the streams of its lane
and is started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO

import numpy as np

from asrpool.server import opusworker, slots

logger = logging.getLogger(__name__)

Failure = Callable[[int, int, str], None]  # slot, generation, reason
Wake = Callable[[int, int], None]  # slot, generation: its messages settled, or room due
MAX_BYTES_IN_FLIGHT = 1 << 20  # a stream's bytes in its child before it is read no more
_MARKER_ID = struct.Struct("<q")
_PIPE_BYTES = 1 << 20  # each pipe's kernel buffer: a step's answers in a few reads
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux's, named in Python 3.10+


class Lane:
    """One decoding child with its writer and reader threads."""

    def __init__(self, index: int, buffers: slots.SlotBuffers, cap: int, report: Failure,
                 on_lost: Callable[[int], None], wake: Wake, room_due: Wake) -> None:
        self.index = index
        self.lost = False  # the child is gone (set by its threads)
        self._buffers = buffers
        self._cap = cap  # a slot's buffer, in samples
        self._report = report  # these four are called from the reader thread
        self._on_lost = on_lost
        self._wake = wake
        self._room_due = room_due  # a held stream's room lets it go on already
        self._outbox = bytearray()  # records not yet written to the child
        self._outbox_lock = threading.Lock()
        self._doorbell: queue.SimpleQueue[None] = queue.SimpleQueue()  # rung: outbox filled
        self._closing = False
        self._served: dict[int, int] = {}  # slot -> the generation whose stream is here
        self._failed: dict[int, int] = {}  # slot -> its generation the child failed
        self._child = subprocess.Popen(
            # -P: the working directory is not put on sys.path (a checkout's operator/).
            [sys.executable, "-P", "-m", "asrpool.server.opusworker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for pipe in (self._child.stdin, self._child.stdout):
            _widen(pipe)
        self._threads = [
            threading.Thread(target=self._write, name=f"opus-lane-{index}-w", daemon=True),
            threading.Thread(target=self._read, name=f"opus-lane-{index}-r", daemon=True)]
        for thread in self._threads:
            thread.start()

    def send_data(self, slot: int, generation: int, data: bytes) -> bool:
        """One ``OggOpus`` message of the stream, with its slot's room now and the samples
        of the stream in its buffer so far; whether the stream is now :meth:`full`."""
        if self._failed.get(slot) == generation:
            return False  # its child failed it: the stream is ending
        now = self._buffers.hand_off(slot, generation, len(data))
        if now is None:  # the stream has ended
            return False
        buffered, received, in_flight = now
        self._served[slot] = generation
        self._send(opusworker.DATA_HEAD.pack(
            opusworker.DATA, slot, generation, opusworker.ROOM_FIELDS.size + len(data),
            max(self._cap - buffered, 0), received), data)
        return in_flight >= MAX_BYTES_IN_FLIGHT

    def send_room(self, slot: int, generation: int) -> None:
        """The slot's room now: its child decodes what that allows and answers with all
        it has decoded (a stream's audio short of a frame waits there otherwise)."""
        buffered, received = self._buffers.buffered_and_received(slot)
        self._send(opusworker.record(opusworker.ROOM, slot, generation,
                                     opusworker.ROOM_FIELDS.pack(
                                         max(self._cap - buffered, 0), received)))

    def send_marker(self, slot: int, generation: int, marker_id: int) -> None:
        self._send(opusworker.record(opusworker.MARKER, slot, generation,
                                     _MARKER_ID.pack(marker_id)))

    def send_init(self, slot: int, generation: int) -> None:
        self._send(opusworker.record(opusworker.INIT, slot, generation))

    def _send(self, *parts: bytes) -> None:
        """One record, in ``parts`` (appended as they are: a message's bytes are not
        copied into a record of their own first)."""
        with self._outbox_lock:
            ring = not self._outbox  # else the writer was rung and has not taken it yet
            for part in parts:
                self._outbox += part
        if ring:
            self._doorbell.put(None)

    @property
    def pid(self) -> int:
        """The decoding child's process id."""
        return self._child.pid

    def full(self, slot: int, generation: int) -> bool:
        """Whether the stream has :data:`MAX_BYTES_IN_FLIGHT` waiting in the child."""
        return self._buffers.bytes_handed_off(slot, generation) >= MAX_BYTES_IN_FLIGHT

    def close(self, timeout: float = 5.0) -> None:
        self._closing = True
        self._doorbell.put(None)
        for thread in self._threads:
            thread.join(timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._child.wait(timeout)
        if self._child.poll() is None:
            self._child.kill()
            self._child.wait()

    def _write(self) -> None:
        """Everything queued since the last write, in one write, until closed."""
        stdin = self._child.stdin
        assert stdin is not None
        try:
            while batch := self._next_batch():
                stdin.write(batch)
                stdin.flush()
        except OSError:  # the child died: the reader tells its streams
            self.lost = True
        with contextlib.suppress(OSError):
            stdin.close()

    def _next_batch(self) -> bytearray:
        """The records queued (waiting for some); empty once closing and all written."""
        while True:
            with self._outbox_lock:
                batch, self._outbox = self._outbox, bytearray()
            if batch or self._closing:
                return batch
            self._doorbell.get()

    def _read(self) -> None:
        """The child's answers until its output ends. A fault here (a bug) ends the lane
        as a dead child does: its streams are told and a new child starts. Left to
        itself the thread would die alone, and those streams would wait on answers that
        no one reads, for ever."""
        stdout = self._child.stdout
        assert stdout is not None
        reader = opusworker.RecordReader(stdout.fileno())
        try:
            while (found := reader.read()) is not None:
                self._apply(found)
        except Exception:
            logger.exception("Opus lane %d could not apply its child's answers", self.index)
        self._lost()

    def _apply(self, records: list[opusworker.Record]) -> None:
        """One read's answers, in order: audio in one go until a marker, an Init, a
        failure or a hold, which land after it."""
        decoded: list[slots.Decoded] = []
        for kind, slot, generation, payload in records:
            if kind == opusworker.PCM:
                settled = opusworker.SETTLED.unpack_from(payload)[0]
                pcm = np.frombuffer(payload, dtype=np.float32, offset=opusworker.SETTLED.size)
                decoded.append((slot, generation, pcm, settled))
                continue
            self._push(decoded)
            decoded = []
            if kind == opusworker.MARKER:
                self._buffers.push_marker(slot, _MARKER_ID.unpack(payload)[0], generation)
            elif kind == opusworker.INIT:
                self._buffers.restart(slot, generation)
            elif kind == opusworker.FAILED:
                self._forget(slot, generation)
                self._report(slot, generation, payload.decode(errors="replace"))
            elif kind == opusworker.HELD:
                self._held(slot, generation, opusworker.DECODED.unpack(payload)[0])
        self._push(decoded)

    def _held(self, slot: int, generation: int, decoded: int) -> None:
        """The child holds the stream's pages for want of room: the next step's look
        reports room once it lets the child go on, or, where it does already (the engine
        took audio since the room the child heard of), the event loop does now."""
        if self._buffers.hold(slot, generation, decoded, self._cap):
            self._room_due(slot, generation)

    def _push(self, decoded: list[slots.Decoded]) -> None:
        if decoded:
            for slot, generation in self._buffers.push_decoded(decoded):
                self._wake(slot, generation)

    def _forget(self, slot: int, generation: int) -> None:
        self._failed[slot] = generation
        if self._served.get(slot) == generation:
            self._served.pop(slot, None)
        self._buffers.drop_hand_offs(slot, generation)

    def _lost(self) -> None:
        """The child's output ended: no stream whose decoder it held can go on (the pod
        ignores those that have ended already)."""
        streams, self._served = list(self._served.items()), {}
        self.lost = True
        for slot, generation in streams:
            self._buffers.drop_hand_offs(slot, generation)
            self._report(slot, generation, "the Opus decoder of this stream failed")
        self._on_lost(self.index)


def _widen(pipe: IO[bytes] | None) -> None:
    """A pipe to or from a child holds :data:`_PIPE_BYTES` (fewer, larger reads and
    writes); the system's default where it refuses."""
    if pipe is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)


class OpusLanes:
    """``workers`` lanes; a slot always uses the same one (its decoder lives there)."""

    def __init__(self, workers: int, buffers: slots.SlotBuffers, cap: int,
                 loop: asyncio.AbstractEventLoop, on_failure: Failure,
                 on_settled: Wake | None = None) -> None:
        self._buffers = buffers
        # A slot's buffer, in samples: a frame at least, or a child could hold pages
        # while the slot has room but less than the frame the engine would take.
        self._cap = max(cap, slots.FRAME_SIZE)
        self._loop = loop
        self._on_failure = on_failure
        self._on_settled = on_settled
        self._lanes = [self._start(index) for index in range(workers)]
        self._closed = False

    def _start(self, index: int) -> Lane:
        return Lane(index, self._buffers, self._cap, self._report, self._lost, self._settled,
                    self._room_due)

    def after_step(self) -> None:
        """The engine took audio: every stream whose child holds pages for want of room,
        and whose room now lets it decode more, hears of that room (the buffer's level is
        no guide: the engine may have taken it under any mark before this runs)."""
        self._send_rooms(self._buffers.rooms_due(self._cap))

    def _send_rooms(self, due: list[tuple[int, int]]) -> None:
        for slot, generation in due:
            self.lane(slot).send_room(slot, generation)

    def pids(self) -> list[int]:
        """The decoding children's process ids, lane by lane."""
        return [lane.pid for lane in self._lanes]

    def lane(self, slot: int) -> Lane:
        lane = self._lanes[slot % len(self._lanes)]
        return self._restart(lane.index) if lane.lost else lane

    def _restart(self, index: int) -> Lane:
        """A lane whose child died (its streams were told) gets a new child."""
        lane = self._lanes[index]
        if lane.lost and not self._closed:
            logger.warning("Opus lane %d lost its decoding child: starting another", index)
            lane.close(0.0)
            lane = self._lanes[index] = self._start(index)
        return lane

    def close(self) -> None:
        self._closed = True
        for lane in self._lanes:
            lane.close()

    def _report(self, slot: int, generation: int, reason: str) -> None:
        """From a reader thread: the stream fails on the event loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the pod is gone
            self._loop.call_soon_threadsafe(self._on_failure, slot, generation, reason)

    def _settled(self, slot: int, generation: int) -> None:
        """From a reader thread: messages the event loop waits on are in."""
        if self._on_settled is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._on_settled, slot, generation)

    def _room_due(self, slot: int, generation: int) -> None:
        """From a reader thread: a held stream may go on now. Its room is sent from the
        event loop, as every record is, if still due (a step's look may have sent it)."""
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._send_room_if_due, slot)

    def _send_room_if_due(self, slot: int) -> None:
        self._send_rooms(self._buffers.rooms_due(self._cap, (slot,)))

    def _lost(self, index: int) -> None:
        """From a reader thread: its lane starts a new child on the event loop."""
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._restart, index)
