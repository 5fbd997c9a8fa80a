"""What a pod and its intake processes say to each other (``--intake-workers``).

One ``SOCK_SEQPACKET`` socket pair per intake process: each datagram holds whole
records, each a header (kind, connection id, payload length) and its payload. A
connection's socket itself travels in an ``OPEN`` record's datagram (``SCM_RIGHTS``).
Datagrams keep their order, so a connection's records arrive in the order sent.

The pod (owner) sends ``OPEN``, ``SEND`` (one result message), ``END`` (last messages,
then a close), ``ACK`` (a slow record is done: read on) and ``TICK`` (a step went by:
look at the rooms again). An intake process sends ``AUDIO`` (checked float32 samples),
``MARKER``, ``INIT``, ``SLOW`` (a client message the pod takes itself, as it came:
OggOpus; ``SLOW_PART`` for each piece of a long one but its last), ``FAULT`` (the
stream ends: a refusal), ``GONE`` (the client left: its close code) and ``CLOSED``
(an ``END``'s messages and close are written, or the connection is gone or unknown).
"""

from __future__ import annotations

import collections
import dataclasses
import socket
import struct
from collections.abc import Iterator
from typing import cast

import msgpack

from asrpool.common import protocol

OPEN, SEND, END, ACK, TICK = 1, 2, 3, 4, 5
AUDIO, MARKER, INIT, SLOW, SLOW_PART, FAULT, GONE, CLOSED = 11, 12, 13, 14, 15, 16, 17, 18
HEAD = struct.Struct("<BII")  # kind, connection id, payload bytes
MARKER_ID = struct.Struct("<q")
CLOSE_CODE = struct.Struct("<H")
DATAGRAM_BYTES = 64 << 10  # records are packed into datagrams of about this much
SOCKET_BUFFER_BYTES = 4 << 20  # asked for; the kernel caps it (wmem_max)

Record = tuple[int, int, memoryview]


def record(kind: int, conn: int, payload: bytes | memoryview = b"") -> list[bytes | memoryview]:
    return [HEAD.pack(kind, conn, len(payload)), payload]


def records(datagram: bytes | memoryview) -> Iterator[Record]:
    view = memoryview(datagram)
    at, end = 0, len(datagram)
    while at < end:
        kind, conn, size = HEAD.unpack_from(view, at)
        at += HEAD.size
        yield kind, conn, view[at:at + size]
        at += size


@dataclasses.dataclass(frozen=True)
class Opening:
    """What an intake process needs to know of a connection handed to it."""

    slot: int
    received: int  # samples of the stream the pod had received before this connection
    kind: str | None  # the stream's kind of audio, once its first audio message fixed it
    first: list[bytes]  # messages to send at once (Ready, then results waiting)

    def pack(self) -> bytes:
        return cast(bytes, msgpack.packb([self.slot, self.received, self.kind, self.first]))

    @classmethod
    def unpack(cls, payload: bytes | memoryview) -> Opening:
        slot, received, kind, first = msgpack.unpackb(payload)
        return cls(int(slot), int(received), kind, list(first))


def pack_refusal(refusal: protocol.Refusal) -> bytes:
    return cast(bytes, msgpack.packb([refusal.message, str(refusal.code), int(refusal.close_code)]))


def unpack_refusal(payload: bytes | memoryview) -> protocol.Refusal:
    message, code, close_code = msgpack.unpackb(payload)
    return protocol.Refusal(str(message), protocol.error_code(code),
                            protocol.CloseCode(close_code))


def end_payload(last: list[bytes], close_code: int) -> bytes:
    return CLOSE_CODE.pack(close_code) + cast(bytes, msgpack.packb(last))


def unpack_end(payload: bytes | memoryview) -> tuple[list[bytes], int]:
    """The messages to send last, and the close code."""
    code = CLOSE_CODE.unpack_from(payload)[0]
    return list(msgpack.unpackb(payload[CLOSE_CODE.size:])), int(code)


def pair() -> tuple[socket.socket, socket.socket]:
    """The owner's end and the intake process's end, with wide buffers."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in (ours, theirs):
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
    return ours, theirs


class Outbox:
    """Records waiting to be sent, packed into datagrams; written when the socket takes
    them (non-blocking: what it refuses now waits for the next :meth:`flush`)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._sealed: collections.deque[tuple[bytes, int | None]] = collections.deque()
        self._parts: list[bytes | memoryview] = []
        self._size = 0

    def add(self, parts: list[bytes | memoryview]) -> None:
        size = sum(len(part) for part in parts)
        if self._size and self._size + size > DATAGRAM_BYTES:
            self._seal()
        self._parts.extend(parts)
        self._size += size

    def add_record(self, kind: int, conn: int, payload: bytes | memoryview = b"") -> None:
        """:meth:`add` of one record (the hot path: a step's results)."""
        size = HEAD.size + len(payload)
        if self._size and self._size + size > DATAGRAM_BYTES:
            self._seal()
        self._parts += (HEAD.pack(kind, conn, len(payload)), payload)
        self._size += size

    def add_socket(self, parts: list[bytes | memoryview], fd: int) -> None:
        """A datagram of its own that carries a connection's socket (kept open by the
        sender until it is sent)."""
        self._seal()
        self._sealed.append((b"".join(parts), fd))

    def empty(self) -> bool:
        return not self._sealed and not self._parts

    def flush(self) -> bool:
        """Send what the socket takes now; whether everything went."""
        self._seal()
        while self._sealed:
            data, fd = self._sealed[0]
            try:
                if fd is None:
                    self._sock.send(data)
                else:
                    socket.send_fds(self._sock, [data], [fd])
            except BlockingIOError:
                return False
            self._sealed.popleft()
        return True

    def _seal(self) -> None:
        if self._parts:
            self._sealed.append((b"".join(self._parts), None))
            self._parts = []
            self._size = 0
