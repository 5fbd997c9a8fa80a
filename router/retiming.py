"""A moved stream's clock: the audio its client sent, and its new pod's times moved on.

A stream that the router moves to another pod (``router.moving``) starts there with a
fresh model context, whose times start at zero again. The client's times must go on
on the stream's own clock, never back: the relay counts the samples of every ``Audio``
message the client sends (from the first bytes of each message: its ``pcm`` array's
length, ``audio_samples``) and adds that much time to every time and step index the
new pod sends. The count costs a few dozen bytes unmasked per client message; the new
pod's messages are decoded and encoded again (moved streams only).
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from asrpool.common import framing, protocol
from asrpool.router import frames

PCM_KEY = b"\xa3pcm"  # msgpack: the key "pcm"
# A pod's Marker, as its first bytes (msgpack: {"type": "Marker", "id": N}).
MARKER_REPLY = b"\x82\xa4type\xa6Marker"
PEEK_BYTES = 48  # of a message's payload: enough for its type and its array's header
_ARRAYS = {0xDC: ">H", 0xDD: ">I"}
_TAKEN = frozenset({frames.BINARY, frames.CLOSE, frames.PING, frames.PONG})


def audio_samples(data: bytes, start: int) -> int:
    """The samples of the ``Audio`` message whose masked payload starts at ``start`` in
    ``data`` (the 4-byte mask just before it): its ``pcm`` array's length, or 0 for any
    other message or one whose start is not in ``data``."""
    head = data[start:start + PEEK_BYTES]
    if len(head) < 8 or start < 4:
        return 0
    plain = frames.unmask(head, data[start - 4:start])
    at = plain.find(PCM_KEY)
    if at < 0 or b"Audio" not in plain:
        return 0
    return _array_length(plain, at + len(PCM_KEY))


def marker_id(data: bytes, start: int) -> int | None:
    """The id of the client ``Marker`` whose masked payload starts at ``start`` in
    ``data``, or None for any other message or one not whole in its first bytes."""
    head = data[start:start + PEEK_BYTES]
    if len(head) < 8 or start < 4:
        return None
    plain = frames.unmask(head, data[start - 4:start])
    if b"Marker" not in plain:
        return None
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(plain)  # what follows the message is the next frame's: never read
    try:
        message = next(unpacker)
    except (StopIteration, ValueError, msgpack.UnpackException):
        return None
    if not isinstance(message, dict) or message.get("type") != "Marker":
        return None
    mid = message.get("id")
    return mid if isinstance(mid, int) and not isinstance(mid, bool) else None


def _array_length(data: bytes, pos: int) -> int:
    if pos >= len(data):
        return 0
    first = data[pos]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    form = _ARRAYS.get(first)
    if form is None or pos + 1 + struct.calcsize(form) > len(data):
        return 0
    length: int = struct.unpack_from(form, data, pos + 1)[0]
    return length


def moved_on(message: dict[str, Any], samples: int) -> dict[str, Any]:
    """A new pod's message on the stream's own clock: ``samples`` of audio later."""
    seconds = samples / protocol.SAMPLE_RATE
    for key in ("start_time", "stop_time"):
        value = message.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            message[key] = round(value + seconds, 6)
    index = message.get("step_idx")
    if isinstance(index, int) and not isinstance(index, bool):
        message["step_idx"] = index + samples // protocol.FRAME_SIZE
    return message


class PodFrames:
    """A new pod's flow cut into whole frames. Our pods send each message as one
    unmasked frame within the size limit: anything else is a pod to give up on."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.buffer = bytearray()

    def feed(self, data: bytes) -> tuple[list[tuple[int, bytes]], str]:
        """The whole frames now in the flow, as (opcode, payload), and what was wrong
        with it ("" when nothing)."""
        self.buffer += data
        whole: list[tuple[int, bytes]] = []
        while True:
            got = framing.header(self.buffer)
            if got is None:
                return whole, ""
            first, opcode, head, size, masked = got
            if masked or first & 0x70 or not first & 0x80 or size > self.max_bytes \
                    or opcode not in _TAKEN:
                return whole, "the pod sent a frame no moved stream takes (masked, " \
                    "fragmented, reserved bits or opcode, or over the size limit)"
            if len(self.buffer) < head + size:
                return whole, ""
            whole.append((opcode, bytes(self.buffer[head:head + size])))
            del self.buffer[:head + size]


def retimed(payload: bytes, samples: int) -> bytes:
    """A new pod's binary message moved on by ``samples``; a message that is no msgpack
    map passes as it is."""
    try:
        message = msgpack.unpackb(payload, raw=False)
    except (ValueError, msgpack.UnpackException):
        return payload
    if not isinstance(message, dict):
        return payload
    packed: bytes = msgpack.packb(moved_on(message, samples))
    return packed
