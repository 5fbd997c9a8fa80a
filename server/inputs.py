"""A stream's audio input: raw ``Audio`` PCM or an ``OggOpus`` stream, never both.

Ogg Opus is decoded with sphn's streaming reader (libopus through Rust's ``ogg`` and
``opus`` crates), which accepts pages split across messages at any byte and gives
mono float32 at 24 kHz whatever the stream's rate. Pages are framed and CRC-checked
here first (sphn loses sync silently on a truncated page), and the first one must hold
an ``OpusHead`` for one channel (sphn would silently down-mix a stereo stream).
"""

from __future__ import annotations

import collections
import dataclasses
import zlib

import numpy as np
from numpy.typing import NDArray

from asrpool.common import oggopus, protocol

_PAGE_HEADER = oggopus.PAGE_HEADER
_CRC_AT = 22
_MAX_PAGE = _PAGE_HEADER + 255 + 255 * 255
_CANDIDATES = 4


# Ogg's CRC is CRC-32 with the polynomial 0x04c11db7 fed most significant bit first,
# no initial value and no final xor. zlib's CRC-32 (the same polynomial, bits reflected,
# 0xffffffff in and out) computes it in C: feed it every byte's bits reversed, undo the
# initial value by linearity (the CRC of as many zero bytes), and reverse the result.
_REVERSED_BITS = bytes(int(f"{byte:08b}"[::-1], 2) for byte in range(256))


def ogg_crc(page: bytes) -> int:
    """Ogg's CRC-32 of a page, its CRC field zeroed."""
    data = page[:_CRC_AT] + b"\0\0\0\0" + page[_CRC_AT + 4:]
    reflected = zlib.crc32(data.translate(_REVERSED_BITS)) ^ zlib.crc32(bytes(len(data)))
    return int(f"{reflected:032b}"[::-1], 2)


def bad_audio(message: str) -> protocol.ProtocolError:
    return protocol.ProtocolError(message, protocol.ErrorCode.BAD_AUDIO)


class OggPages:
    """Bytes in any pieces, whole checked Ogg pages out (sphn's reader takes them).

    A truncated page (the next one's bytes read as its rest) or a corrupt one is an
    error, never a silent loss of sync: a page not directly followed by the next
    capture pattern must pass its CRC (so the CRC, pure Python, runs on about one page
    per message, not on every byte).
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.count = 0

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        pages = []
        while (page := self._next()) is not None:
            pages.append(page)
        return pages

    def _next(self) -> bytes | None:
        buffer = self._buffer
        if len(buffer) >= 4 and buffer[:4] != b"OggS":
            raise bad_audio(f"OggOpus data after page {self.count} is not an Ogg page "
                            "(no 'OggS' capture pattern): a truncated page or not Ogg at all")
        size = oggopus.page_size(buffer)
        if size is None or len(buffer) < size:
            if _valid_page_inside(buffer):  # the next page began before this one ended
                raise bad_audio(f"Ogg page {self.count} is truncated (the next page "
                                "starts inside it)")
            return None
        page = bytes(buffer[:size])
        followed = buffer[size:size + 4] == b"OggS"  # then it cannot be truncated
        del buffer[:size]
        if not followed and not _crc_ok(page):
            raise bad_audio(f"Ogg page {self.count} fails its CRC check: truncated or corrupt")
        self.count += 1
        return page


def _crc_ok(page: bytes | bytearray) -> bool:
    return int.from_bytes(page[_CRC_AT:_CRC_AT + 4], "little") == ogg_crc(bytes(page))


def _valid_page_inside(buffer: bytearray) -> bool:
    """Whether a whole page with a good CRC starts after the first one's capture pattern
    (the first few candidates only: a page's payload may hold the pattern by chance)."""
    at = buffer.find(b"OggS", 4, _MAX_PAGE)
    for _ in range(_CANDIDATES):
        if at < 0:
            return False
        size = oggopus.page_size(buffer[at:])
        if size is not None and len(buffer) - at >= size and _crc_ok(buffer[at:at + size]):
            return True
        at = buffer.find(b"OggS", at + 4, _MAX_PAGE)
    return False


def check_opus_head(page: bytes) -> None:
    """The first page must hold an ``OpusHead`` for one channel (sphn would silently
    down-mix a stereo stream)."""
    packet = page[_PAGE_HEADER + page[26]:]
    if packet[:8] != b"OpusHead" or len(packet) < 10:
        raise bad_audio("OggOpus stream does not start with an OpusHead packet (not Opus)")
    if packet[9] != 1:
        raise bad_audio(f"OggOpus stream has {packet[9]} channels; only mono is accepted")


class OpusDecoder:
    """Pieces of one Ogg Opus stream in, 24 kHz mono float32 out.

    Each page is measured from its packets before it is decoded
    (:class:`asrpool.common.oggopus.Counter`), so a caller can have only as much decoded
    as it has room for: the other pages wait, still encoded (:attr:`pending`), for the
    next call. A page holds at most 255 packets of 120 ms, so one decode step is
    bounded whatever the message (a message of empty packets declares hours).
    """

    def __init__(self) -> None:
        import sphn

        self._reader = sphn.OpusStreamReader(protocol.SAMPLE_RATE)
        self._pages = OggPages()
        self._counter = oggopus.Counter()
        self._waiting: collections.deque[bytes] = collections.deque()
        self._head: int | None = None  # the first waiting page's samples, once counted
        self.pending = 0  # bytes of whole pages not decoded yet

    def decode(self, data: bytes, room: int | None = None) -> NDArray[np.float32]:
        """Decode ``data`` and the pages waiting before it: all of them, or (``room``
        samples given) whole pages until they fill the room, one page at least."""
        self.take(data)
        return self._decode_pages([page for page, _ in self.next_pages(room)])

    def take(self, data: bytes) -> None:
        """Frame ``data`` into whole checked pages, which wait (still encoded)."""
        first = self._pages.count == 0
        pages = self._pages.feed(data)
        if first and pages:
            check_opus_head(pages[0])
        for page in pages:
            self._waiting.append(page)
            self.pending += len(page)

    def next_pages(self, room: int | None) -> list[tuple[bytes, int]]:
        """The waiting pages due now, each with the samples at 24 kHz it declares: all of
        them, or whole pages until they fill ``room`` samples, one page at least."""
        due: list[tuple[bytes, int]] = []
        declared = 0
        while self._waiting:
            samples = self._head_samples()
            if room is not None and declared and declared + samples > room:
                break
            page = self._waiting.popleft()
            self._head = None
            self.pending -= len(page)
            due.append((page, samples))
            declared += samples
        return due

    def _decode_pages(self, pages: list[bytes]) -> NDArray[np.float32]:
        if not pages:
            return np.zeros(0, dtype=np.float32)
        out = np.concatenate([self._decode_page(page) for page in pages])
        problem = protocol.sample_problem(out)
        if problem is not None:
            raise bad_audio(f"decoded Ogg Opus audio {problem}")
        return out

    def _head_samples(self) -> int:
        """Samples at 24 kHz the first waiting page declares (counted once, when it is
        first weighed: a message of many pages costs no count before its turn)."""
        if self._head is None:
            self._head = (self._counter.page(self._waiting[0]) * protocol.SAMPLE_RATE
                          // oggopus.RATE)
        return self._head

    def _decode_page(self, page: bytes) -> NDArray[np.float32]:
        try:  # one page at a time: sphn's reader fails on many pages in one call
            pcm = self._reader.append_bytes(page)
        except ValueError as exc:  # sphn reports what it cannot decode as ValueError
            raise bad_audio(f"undecodable Ogg Opus data: {exc}") from exc
        return np.asarray(pcm, dtype=np.float32).reshape(-1)


@dataclasses.dataclass
class StreamInput:
    """What kind of audio a stream sends, fixed by its first audio message."""

    kind: str | None = None  # "Audio" | "OggOpus"
    opus: OpusDecoder | None = None

    def pcm(self, message: protocol.AudioMessage | protocol.OggOpusMessage) -> NDArray[np.float32]:
        """The message's audio, all of it decoded."""
        if message["type"] == "Audio":
            self.claim("Audio")
            return message["pcm"]
        return self.opus_decoder().decode(message["data"])

    def opus_decoder(self) -> OpusDecoder:
        """The stream's Opus decoder (the stream is an OggOpus one from now on)."""
        self.claim("OggOpus")
        if self.opus is None:
            self.opus = OpusDecoder()
        return self.opus

    def claim(self, kind: str) -> None:
        """The stream sends ``kind`` of audio (its first audio message fixes it)."""
        if self.kind is None:
            self.kind = kind
        elif self.kind != kind:
            raise protocol.ProtocolError(
                f"this stream sends {self.kind}; {kind} cannot be mixed in "
                "(one kind of audio per stream)", protocol.ErrorCode.MIXED_AUDIO)
