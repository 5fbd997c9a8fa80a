"""A light websocket frame-header scanner for the router's byte relay (RFC 6455 section 5.2).

The relay passes bytes through unchanged; a :class:`Scanner` per direction reads
only frame headers, so that the router still knows where frames begin and end. It
returns the bytes to pass on, with the control frames the router answers itself cut
out; holds back a header split over two reads until it is whole; counts data
messages; and on both directions enforces the message-size limit from each header,
before the payload arrives (a fragmented message's fragments counted together: the
fragment that takes it over the limit is refused, and :attr:`Scanner.fragmented` then
says that fragments before it were passed), and the framing rules (masked from a
client, unmasked from a pod, no RSV bits since no extension is negotiated, known
opcodes, whole small control frames, continuations only inside a fragmented message).
A pod is held to them as a client is: a hostile or broken pod that declares a huge
frame is refused from its header, and never makes the router buffer it.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
import sys
from collections.abc import Callable
from typing import NamedTuple

from asrpool.common import framing

CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_OPCODES = frozenset({CONT, TEXT, BINARY, CLOSE, PING, PONG})


class Fault(enum.Enum):
    NONE = "none"
    TOO_LARGE = "too_large"  # a message over the limit (its size in Scan.size)
    PROTOCOL = "protocol"  # a frame a server must refuse (close 1002)


@dataclasses.dataclass(frozen=True)
class Control:
    opcode: int
    payload: bytes  # unmasked


class Scan(NamedTuple):
    """What one read held: bytes to pass on, control frames cut out, a fault. A tuple,
    not a dataclass: one is made per read of each relayed stream."""

    forward: bytes
    controls: tuple[Control, ...] = ()
    fault: Fault = Fault.NONE
    size: int = 0
    rest: bytes = b""  # of a fault: the read from the faulty frame's header on


_make = tuple.__new__


def _passed(data: bytes) -> Scan:
    """The Scan of a read passed whole (NamedTuple's own constructor costs 4x as much)."""
    return _make(Scan, (data, (), Fault.NONE, 0, b""))


def frame(opcode: int, payload: bytes = b"", mask: bytes | None = None) -> bytes:
    """One final frame; masked with the 4-byte ``mask`` when given (a client's frame)."""
    size, bit = len(payload), 0x80 if mask is not None else 0
    if size < 126:
        head = struct.pack("!BB", 0x80 | opcode, bit | size)
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, bit | 126, size)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, bit | 127, size)
    if mask is None:
        return head + payload
    return head + mask + unmask(payload, mask)


def close_frame(code: int, reason: str = "", mask: bytes | None = None) -> bytes:
    payload = struct.pack("!H", code) + reason.encode()[:123]
    return frame(CLOSE, payload, mask)


def close_code(payload: bytes) -> tuple[int, str]:
    """(code, reason) of a close frame's payload; 1005 when it names none."""
    if len(payload) < 2:
        return 1005, ""
    return struct.unpack_from("!H", payload)[0], payload[2:].decode(errors="replace")


def unmask(payload: bytes, mask: bytes) -> bytes:
    """XOR with the repeating 4-byte mask (its own inverse); for small control frames."""
    if not payload:
        return payload
    key = int.from_bytes((mask * (len(payload) // 4 + 1))[: len(payload)], "big")
    return (int.from_bytes(payload, "big") ^ key).to_bytes(len(payload), "big")


header = framing.header  # (first byte, opcode, header length, payload length, mask bit)


class Scanner:
    """One direction's frame boundaries. ``from_client`` checks what a server must
    check and the size limit; ``cut`` names the control opcodes taken out of the flow."""

    def __init__(self, from_client: bool, max_bytes: int, cut: frozenset[int]) -> None:
        self.from_client, self.max_bytes, self.cut = from_client, max_bytes, cut
        self.skip = 0  # payload bytes of the current frame still to pass
        self.held = b""  # the start of a header (or a cut control frame) not whole yet
        self.message = 0  # bytes so far of a fragmented data message
        self.fragmented = False
        self.messages = 0  # whole data messages passed
        # Told (the read, the offset of the payload) of each data message's first frame
        # whose header is in a read: the relay's clock of a stream (router.retiming).
        self.peek: Callable[[bytes, int], None] | None = None

    @property
    def at_boundary(self) -> bool:
        """Whether the bytes passed so far end on a frame boundary (so the router may
        put a frame of its own into the flow)."""
        return self.skip == 0

    def feed(self, data: bytes) -> Scan:
        if self.held:
            data, self.held = self.held + data, b""
        end, pos = len(data), self.skip
        if pos >= end:  # the common read: the middle of a big payload
            self.skip = pos - end
            return _passed(data)
        self.skip = 0
        pieces: list[bytes] = []  # of the bytes passed, when a control frame is cut out
        controls: list[Control] = []
        start = 0  # of the bytes not yet put into pieces
        while pos < end:
            got = header(data, pos)
            if got is None:
                break
            first, opcode, head, size, masked = got
            fault = self._check(first, opcode, size, masked)
            if fault is not Fault.NONE:
                pieces.append(data[start:pos])
                return Scan(b"".join(pieces), tuple(controls), fault, self.message + size,
                            data[pos:])
            if opcode >= CLOSE:
                if end - pos < head + size:
                    break  # a control frame is whole before it is looked at
                if opcode in self.cut:
                    body = data[pos + head : pos + head + size]
                    mask = data[pos + head - 4 : pos + head] if masked else b""
                    controls.append(Control(opcode, unmask(body, mask) if mask else body))
                    pieces.append(data[start:pos])
                    start = pos + head + size
                pos += head + size
                continue
            if self.peek is not None and opcode != CONT:
                self.peek(data, pos + head)
            self._count(first, size)
            pos += head + size
        else:
            self.skip = pos - end  # the rest of the last frame's payload comes later
            pos = end
        self.held = data[pos:]  # a header (or a control frame) not whole yet
        if not pieces:
            return _passed(data if pos == end else data[:pos])
        pieces.append(data[start:pos])
        return Scan(b"".join(pieces), tuple(controls))

    def discarding(self) -> Scanner:
        """A scanner of the same flow from a refused frame's header on, which passes
        everything (the caller drops it) and checks no size: so that the rest of a
        refused client's bytes, its refused frame's payload and the rest of its message
        first, can be read and dropped, and its close still found."""
        flow = Scanner(self.from_client, sys.maxsize, self.cut)
        flow.fragmented = self.fragmented
        return flow

    def _count(self, first: int, size: int) -> None:
        fin = bool(first & 0x80)
        self.fragmented = not fin
        self.message = 0 if fin else self.message + size
        self.messages += fin

    def _check(self, first: int, opcode: int, size: int, masked: int) -> Fault:
        """What must be refused in a frame: a client's frames are masked, a server's
        are not (RFC 6455 5.1); the rest holds both ways."""
        fin = first & 0x80
        if first & 0x70 or opcode not in _OPCODES or bool(masked) != self.from_client:
            return Fault.PROTOCOL
        if opcode >= CLOSE:
            return Fault.PROTOCOL if not fin or size > 125 else Fault.NONE
        if (opcode == CONT) != self.fragmented:
            return Fault.PROTOCOL
        if self.message + size > self.max_bytes:
            return Fault.TOO_LARGE
        return Fault.NONE
