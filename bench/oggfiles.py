"""Ogg Opus files built packet by packet, for inputs no encoder would write (a few
bytes that declare long audio): the upload tests and ``asrpool bench soak``'s bombs."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from asrpool.common import protocol
from asrpool.server import inputs

SERIAL = 0x5EED
FRAME_20_MS = 960  # samples at 48 kHz


def empty_packet(frames: int) -> bytes:
    """A 2-byte packet of ``frames`` empty 20 ms CELT frames (TOC config 31, code 3, CBR)."""
    return bytes([31 << 3 | 3, frames])


EMPTY_120_MS = empty_packet(6)
OPUS_HEAD = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, 312, protocol.SAMPLE_RATE, 0, 0)
OPUS_TAGS = b"OpusTags" + struct.pack("<I", 7) + b"asrpool" + struct.pack("<I", 0)


def single_frames(packet: bytes) -> list[bytes]:
    """An Opus packet of one or two frames (RFC 6716, 3.2: codes 0, 1 and 2) as packets of
    one frame each (code 0, the same TOC configuration): what an encoder set to 20 ms
    would have sent for sphn's 40 ms packets. The frames decode to the same samples."""
    toc, code = packet[0], packet[0] & 3
    if code == 0:
        return [packet]
    if code == 1:  # two frames of equal size
        if (len(packet) - 1) % 2:
            raise ValueError("a code 1 Opus packet with an odd payload")
        half = (len(packet) - 1) // 2
        frames = [packet[1:1 + half], packet[1 + half:]]
    elif code == 2:  # two frames, the first's size in one or two bytes
        size, at = packet[1], 2
        if size >= 252:
            size, at = size + 4 * packet[2], 3
        frames = [packet[at:at + size], packet[at + size:]]
    else:
        raise ValueError("an Opus packet of code 3 (several frames) is not split here")
    return [bytes([toc & ~3 & 0xff]) + frame for frame in frames]


def page(packets: Sequence[bytes], sequence: int, granule: int, flags: int = 0) -> bytes:
    """One Ogg page holding whole ``packets`` (each under 255 bytes), its CRC set."""
    lacing = bytes(len(packet) for packet in packets)
    header = struct.pack("<4sBBqIIIB", b"OggS", 0, flags, granule, SERIAL, sequence, 0,
                         len(lacing))
    raw = header + lacing + b"".join(packets)
    crc = inputs.ogg_crc(raw)
    return raw[:22] + struct.pack("<I", crc) + raw[26:]


def opus_file(audio_packets: Sequence[bytes], samples_per_packet: int,
              per_page: int = 255) -> bytes:
    """OpusHead, OpusTags, then the packets ``per_page`` to a page (granules at 48 kHz)."""
    pages = [page([OPUS_HEAD], 0, 0, flags=2), page([OPUS_TAGS], 1, 0)]
    for start in range(0, len(audio_packets), per_page):
        chunk = audio_packets[start:start + per_page]
        last = start + len(chunk) >= len(audio_packets)
        granule = (start + len(chunk)) * samples_per_packet
        pages.append(page(chunk, len(pages), granule, flags=4 if last else 0))
    return b"".join(pages)
