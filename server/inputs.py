"""A stream's audio input: raw ``Audio`` PCM or an ``OggOpus`` stream, never both.

Ogg Opus is decoded with sphn's streaming reader (libopus through Rust's ``ogg`` and
``opus`` crates), which accepts pages split across messages at any byte and gives
mono float32 at 24 kHz whatever the stream's rate. Before any audio is taken from a
stream, its first page is checked here: it must be an Ogg page holding an ``OpusHead``
for one channel (sphn would silently down-mix a stereo stream).
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from asrpool.common import protocol

_PAGE_HEADER = 27  # "OggS", version, type, granule (8), serial (4), sequence (4), CRC (4), segments
_HEAD_LIMIT = 1 << 16  # a first page larger than this is not an OpusHead page


def _bad(message: str) -> protocol.ProtocolError:
    return protocol.ProtocolError(message, "bad_audio")


def check_opus_head(head: bytes) -> bool:
    """True once ``head`` (the stream's first bytes) holds a valid mono ``OpusHead`` page,
    False while more bytes are needed; raises :class:`protocol.ProtocolError` otherwise."""
    if head[:4] != b"OggS"[:len(head[:4])]:
        raise _bad("OggOpus data is not an Ogg stream (no 'OggS' capture pattern)")
    if len(head) < _PAGE_HEADER:
        return False
    segments = head[26]
    start = _PAGE_HEADER + segments
    if len(head) < start + 10:
        if len(head) > _HEAD_LIMIT:
            raise _bad("OggOpus stream's first page is too large to be an OpusHead")
        return False
    packet = head[start:start + 10]
    if packet[:8] != b"OpusHead":
        raise _bad("OggOpus stream does not start with an OpusHead packet (not Opus)")
    channels = struct.unpack_from("B", packet, 9)[0]
    if channels != 1:
        raise _bad(f"OggOpus stream has {channels} channels; only mono is accepted")
    return True


class OpusDecoder:
    """Pieces of one Ogg Opus stream in, 24 kHz mono float32 out."""

    def __init__(self) -> None:
        import sphn

        self._reader = sphn.OpusStreamReader(protocol.SAMPLE_RATE)
        self._head = b""
        self._checked = False

    def decode(self, data: bytes) -> np.ndarray:
        if not self._checked:
            self._head += data
            if not check_opus_head(self._head):
                return np.zeros(0, dtype=np.float32)
            self._checked, data, self._head = True, self._head, b""
        try:
            pcm = self._reader.append_bytes(data)
        except ValueError as exc:  # sphn reports broken pages as ValueError
            raise _bad(f"broken Ogg Opus data (a truncated or corrupt page?): {exc}") from exc
        return np.asarray(pcm, dtype=np.float32).reshape(-1)


@dataclasses.dataclass
class StreamInput:
    """What kind of audio a stream sends, fixed by its first audio message."""

    kind: str | None = None  # "Audio" | "OggOpus"
    opus: OpusDecoder | None = None

    def pcm(self, message: protocol.AudioMessage | protocol.OggOpusMessage) -> np.ndarray:
        self._claim(message["type"])
        if message["type"] == "Audio":
            return message["pcm"]
        if self.opus is None:
            self.opus = OpusDecoder()
        return self.opus.decode(message["data"])

    def _claim(self, kind: str) -> None:
        if self.kind is None:
            self.kind = kind
        elif self.kind != kind:
            raise protocol.ProtocolError(
                f"this stream sends {self.kind}; {kind} cannot be mixed in "
                "(one kind of audio per stream)", "mixed_audio")
