"""A pod's Opus decoding child: streams' OggOpus messages in on standard input, 24 kHz
PCM out.

Framing, checking, weighing and decoding an Ogg Opus page costs the pod's event loop
far more than reading the message that carries it (sphn alone holds the GIL some
50 us per 40 ms page). With ``--opus-workers N`` a pod hands each ``OggOpus`` message's
bytes, as they came, to one of N of these children instead (:mod:`opuslanes`; a slot
always to the same child), which keeps that slot's framer and decoder. Records both
ways are :data:`HEADER` (kind, slot, generation, length) then ``length`` bytes:

- ``DATA`` in: :data:`ROOM_FIELDS` (the slot's room and the samples the pod has
  applied of this stream), then the message's bytes (any piece of the Ogg stream);
- ``ROOM`` in: :data:`ROOM_FIELDS` alone, the pod's word that the engine took audio or
  that it waits on the stream: the child answers with all it has decoded;
- ``HELD`` out: :data:`DECODED` (the samples decoded for the stream so far), after the
  audio: the stream's pages wait for room, and the pod sends ``ROOM`` once the room it
  has lets the child decode past that (said when a hold starts, and again after each
  answer that decoded pages before it held);
- ``PCM`` out: :data:`SETTLED` (how many ``DATA`` messages are now wholly decoded)
  then float32 samples (native order). A stream's audio is sent once it makes a whole
  frame (the engine steps nothing less), or sooner when a marker, an ``Init``, a
  failure or a ``ROOM`` needs it: so a stream sending 20 ms pages costs the pod one
  answer per frame, not four;
- ``FAILED`` out: the reason (UTF-8), after which that stream's further records are
  dropped unanswered (the pod ends it);
- ``MARKER`` (8 bytes: the id) and ``INIT`` in: echoed out in their place among the
  stream's audio, so the pod applies them after the audio sent before them.

Decoded audio is bounded while decoding: a page is decoded only while the stream has
credit, the room the pod last reported less what was decoded since and not yet applied
(:class:`Credit`); the rest waits here, still encoded, for the next ``ROOM``, and the
child says so (``HELD``, with everything it decoded sent first). A page holds at most
255 packets of 120 ms, so one page past the room is the most a stream can overshoot.
A record of a new generation on a slot starts a new stream there, so the child holds
one stream per slot it serves. It reads whatever has come, decodes what it may, and
answers in one write; it exits at the end of its input.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import struct
import sys
from typing import Any

import numpy as np
from numpy.typing import NDArray

from asrpool.common import oggopus, protocol
from asrpool.server import inputs

HEADER = struct.Struct("<BIII")  # kind, slot, generation, payload length
ROOM_FIELDS = struct.Struct("<qq")  # room in samples, samples applied by the pod
DATA_HEAD = struct.Struct("<BIIIqq")  # HEADER then ROOM_FIELDS: a DATA record's start
SETTLED = struct.Struct("<I")
DECODED = struct.Struct("<q")  # a HELD record's payload
DATA, PCM, FAILED, MARKER, INIT, ROOM, HELD = range(7)
_READ = 1 << 20
_SETTLE = -1  # in a stream's queue: one DATA message is wholly decoded once here
_NONE = np.zeros(0, dtype=np.float32)


def record(kind: int, slot: int, generation: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, slot, generation, len(payload)) + payload


@dataclasses.dataclass
class Credit:
    """How much a stream may still decode: the room the pod reported when it had
    applied ``applied`` samples, less what was decoded here since."""

    room: int = 0
    applied: int = 0
    decoded: int = 0  # samples decoded for this stream so far

    def update(self, payload: bytes | memoryview) -> None:
        self.room, self.applied = ROOM_FIELDS.unpack_from(payload)

    def spend(self, declared: int, decoded: int) -> None:
        """A page decoded: it costs what its packets declared (at least what it gave)."""
        self.decoded += decoded
        self.room -= max(declared - decoded, 0)

    @property
    def left(self) -> int:
        return self.room - (self.decoded - self.applied)


class Stream:
    """One slot's stream: its Ogg framing, its packet count, its decoder, and what
    waits in order: pages (with the samples they declare), settles and echoes."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.credit = Credit()
        self.failed = False  # told the pod
        self.doomed = False  # bad bytes wait in the queue: no more are taken
        self._pages = inputs.OggPages()
        self._counter = oggopus.Counter()
        self._reader: Any = None
        self._waiting: collections.deque[tuple[int, int, bytes]] = collections.deque()
        self._pcm: list[NDArray[np.float32]] = []  # decoded, not yet sent
        self._samples = 0  # in _pcm
        self._settled = 0
        self._holding = False  # the last pump stopped for want of room (and said so)

    def take(self, data: bytes) -> None:
        """A message's bytes: its whole pages wait, weighed, then its settle. Bytes that
        are not a mono Ogg Opus stream fail the stream in their place (the audio before
        them is answered first), and nothing after them is taken."""
        if self.doomed:
            return
        try:
            for page in self._framed(data):
                declared = self._counter.page(page) * protocol.SAMPLE_RATE // oggopus.RATE
                self._waiting.append((DATA, declared, page))
        except protocol.ProtocolError as exc:  # failed in its place, after the audio before
            self._waiting.append((FAILED, 0, str(exc).encode()))
            self.doomed = True
            return
        self._waiting.append((_SETTLE, 0, b""))

    def _framed(self, data: bytes) -> list[bytes]:
        first = self._pages.count == 0
        pages = self._pages.feed(data)
        if first and pages:
            inputs.check_opus_head(pages[0])
        return pages

    def echo(self, kind: int, payload: bytes) -> None:
        self._waiting.append((kind, 0, payload))

    def pump(self, slot: int, everything: bool = False) -> bytes:
        """Decode what the credit allows, in order; the records that answer it (a
        failure last, after the audio decoded before it). Audio short of a frame waits
        for more, unless ``everything`` or pages wait for room (:meth:`_hold`)."""
        out: list[bytes] = []
        decoded = False  # a page, in this pump
        try:
            while self._waiting:
                kind, declared, payload = self._waiting[0]
                if kind == DATA and self.credit.left <= 0:
                    return b"".join([*out, self._hold(slot, decoded)])
                self._waiting.popleft()
                if kind == DATA:
                    self._decode(payload, declared)
                    decoded = True
                elif kind == _SETTLE:
                    self._settled += 1
                elif kind == FAILED:
                    raise protocol.ProtocolError(payload.decode(), protocol.ErrorCode.BAD_AUDIO)
                else:
                    out += [self._flush(slot, True),
                            record(kind, slot, self.generation, payload)]
        except protocol.ProtocolError as exc:
            self.failed = True
            return b"".join([*out, self._flush(slot, True), self.failure(slot, str(exc))])
        self._holding = False
        return b"".join([*out, self._flush(slot, everything)])

    def _hold(self, slot: int, decoded: bool) -> bytes:
        """Pages wait, still encoded, for room: all that is decoded goes now (no more comes
        before the pod takes some), then ``HELD`` with how much that makes, the pod's cue
        to report room once it lets this stream decode more. Said when a hold starts and
        after a pump that decoded pages; a record that changes nothing (a message or a
        ROOM with no more room) is answered with nothing new."""
        answer = self._flush(slot, True)
        if self._holding and not decoded:
            return answer
        self._holding = True
        return answer + record(HELD, slot, self.generation,
                               DECODED.pack(self.credit.decoded))

    def failure(self, slot: int, reason: str) -> bytes:
        self.failed = True
        return record(FAILED, slot, self.generation, reason.encode())

    def _decode(self, page: bytes, declared: int) -> None:
        if self._reader is None:
            import sphn

            self._reader = sphn.OpusStreamReader(protocol.SAMPLE_RATE)
        try:  # one page at a time: sphn's reader fails on many pages in one call
            pcm = np.asarray(self._reader.append_bytes(page), dtype=np.float32).reshape(-1)
        except ValueError as exc:  # sphn reports what it cannot decode as ValueError
            raise inputs.bad_audio(f"undecodable Ogg Opus data: {exc}") from exc
        problem = protocol.sample_problem(pcm)
        if problem is not None:
            raise inputs.bad_audio(f"decoded Ogg Opus audio {problem}")
        self.credit.spend(declared, len(pcm))
        self._pcm.append(pcm)
        self._samples += len(pcm)

    def _flush(self, slot: int, everything: bool) -> bytes:
        """The audio decoded and the messages settled since the last answer, if they make
        a frame or ``everything`` is due."""
        if not (everything or self._samples >= protocol.FRAME_SIZE):
            return b""
        if not self._pcm and not self._settled:
            return b""
        pcm = self._pcm[0] if len(self._pcm) == 1 else np.concatenate(self._pcm or [_NONE])
        answer = record(PCM, slot, self.generation, SETTLED.pack(self._settled) + pcm.tobytes())
        self._pcm, self._settled, self._samples = [], 0, 0
        return answer


class Streams:
    """The stream of every slot this child serves, for its current generation."""

    def __init__(self) -> None:
        self._streams: dict[int, Stream] = {}
        self._failed: set[tuple[int, int]] = set()

    def answer(self, records: list[Record]) -> bytes:
        """Every record of one read, then what they let decode."""
        out: list[bytes] = []
        due: dict[int, tuple[Stream, bool]] = {}  # slot -> its stream, all it has due
        for kind, slot, generation, payload in records:
            stream = self._stream(slot, generation)
            if stream is None:
                continue
            self._take(stream, kind, payload)
            due[slot] = stream, kind == ROOM or due.get(slot, (stream, False))[1]
        for slot, (stream, everything) in due.items():
            out.append(stream.pump(slot, everything))
            if stream.failed:
                self._end(slot, stream)
        return b"".join(out)

    def _stream(self, slot: int, generation: int) -> Stream | None:
        """The slot's stream of ``generation`` (a new one replaces the slot's last);
        None once that stream has failed."""
        if (slot, generation) in self._failed:
            return None
        stream = self._streams.get(slot)
        if stream is None or stream.generation != generation:
            self._failed = {key for key in self._failed if key[0] != slot}
            stream = self._streams[slot] = Stream(generation)
        return stream

    @staticmethod
    def _take(stream: Stream, kind: int, payload: bytes) -> None:
        if kind == DATA:
            stream.credit.update(payload)
            stream.take(payload[ROOM_FIELDS.size:])
        elif kind == ROOM:
            stream.credit.update(payload)
        else:
            stream.echo(kind, payload)

    def _end(self, slot: int, stream: Stream) -> None:
        self._failed.add((slot, stream.generation))
        del self._streams[slot]


Record = tuple[int, int, int, bytes]  # kind, slot, generation, payload


def records(data: bytes | bytearray, at: int = 0,
            end: int | None = None) -> tuple[list[Record], int]:
    """The whole records in ``data[at:end]``; and where the first partial one starts."""
    found = []
    size = HEADER.size
    end = len(data) if end is None else end
    while end - at >= size:
        kind, slot, generation, length = HEADER.unpack_from(data, at)
        if end - at - size < length:
            break
        start = at + size
        found.append((kind, slot, generation, bytes(data[start:start + length])))
        at = start + length
    return found, at


class RecordReader:
    """Records from a pipe, read into one buffer that is kept (a fresh megabyte for each
    read would cost more than the records in it)."""

    def __init__(self, fd: int, size: int = _READ) -> None:
        self._fd = fd
        self._buffer = bytearray(size)
        self._start = self._end = 0  # the unread bytes

    def read(self) -> list[Record] | None:
        """The records that one read completes (maybe none); None at the end of input."""
        self._make_room()
        with memoryview(self._buffer) as view:
            count = os.readv(self._fd, [view[self._end:]])
        if not count:
            return None
        self._end += count
        found, self._start = records(self._buffer, self._start, self._end)
        if self._start == self._end:
            self._start = self._end = 0
        return found

    def _make_room(self) -> None:
        """Unread bytes to the front; a buffer that one record overfills grows to hold it."""
        if self._end < len(self._buffer):
            return
        unread = self._end - self._start
        needed = len(self._buffer)
        if self._start == 0 and unread >= HEADER.size:
            needed = max(needed * 2, HEADER.size + HEADER.unpack_from(self._buffer)[3])
        buffer = bytearray(needed) if needed > len(self._buffer) else self._buffer
        buffer[:unread] = self._buffer[self._start:self._end]
        self._buffer, self._start, self._end = buffer, 0, unread


def serve(read_fd: int, write_fd: int) -> None:
    streams = Streams()
    reader = RecordReader(read_fd)
    while (found := reader.read()) is not None:
        _write_all(write_fd, streams.answer(found))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def main() -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with contextlib.suppress(BrokenPipeError):  # the pod is gone: nobody is left to answer
        serve(sys.stdin.fileno(), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
