"""How much audio Ogg Opus bytes hold, read from the packets' TOC bytes, before decoding.

A few bytes of Opus can decode to seconds of audio (a 3-byte packet declares up to
120 ms), so a stream's length must be known before it is decoded, not after. Every Opus
packet begins with a TOC byte (RFC 6716, section 3.1): its configuration gives the
frame duration, its two low bits the frame count (code 3: the count is in the next
byte). An empty packet (a lost frame, concealed by the decoder) is counted as the
longest packet, 120 ms, so that no input decodes to more than it is counted for.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numpy.typing import NDArray

RATE = 48_000  # Opus durations are counted at 48 kHz whatever the stream's rate
MAX_PACKET = 5_760  # 120 ms: no packet decodes to more (RFC 6716, section 3.2.5)
PAGE_HEADER = 27  # "OggS", version, type, granule (8), serial (4), sequence (4), CRC (4), segments
_HEADER_PACKETS = 2  # OpusHead and OpusTags carry no audio
_SILK = (480, 960, 1920, 2880)  # configurations 0-11: 10, 20, 40, 60 ms
_HYBRID = (480, 960)  # 12-15: 10, 20 ms
_CELT = (120, 240, 480, 960)  # 16-31: 2.5, 5, 10, 20 ms
_FRAME_OF_CONFIG = np.asarray([*(_SILK[c % 4] for c in range(12)),
                               *(_HYBRID[c % 2] for c in range(12, 16)),
                               *(_CELT[c % 4] for c in range(16, 32))], dtype=np.int64)


def packet_samples(head: bytes) -> int:
    """Samples at 48 kHz that a packet beginning with ``head`` (its first two bytes, or
    fewer if it is shorter) decodes to at most."""
    if not head:
        return MAX_PACKET
    config, code = head[0] >> 3, head[0] & 3
    if config < 12:
        frame = _SILK[config % 4]
    elif config < 16:
        frame = _HYBRID[config % 2]
    else:
        frame = _CELT[config % 4]
    if code == 0:
        frames = 1
    elif code in (1, 2):
        frames = 2
    else:
        frames = head[1] & 0x3F if len(head) > 1 else 0
    return min(frames * frame, MAX_PACKET)


@dataclasses.dataclass
class Counter:
    """Samples at 48 kHz of the audio packets in a stream's pages, fed in order.

    A packet may run on over pages (a lacing value of 255 ends a page); it is counted
    where it starts, from its first two bytes, which a page holds whenever the packet
    is longer than one byte.
    """

    packets: int = 0
    samples: int = 0
    _continuing: bool = False

    def page(self, page: bytes | bytearray | memoryview) -> int:
        """Count one whole page; the samples it adds."""
        segments = page[26]
        offset = PAGE_HEADER + segments
        added = 0
        for lacing in page[PAGE_HEADER:PAGE_HEADER + segments]:
            if not self._continuing:
                if self.packets >= _HEADER_PACKETS:
                    added += packet_samples(bytes(page[offset:offset + min(lacing, 2)]))
                self.packets += 1
            offset += lacing
            self._continuing = lacing == 255
        self.samples += added
        return added


def page_size(buffer: bytes | bytearray | memoryview) -> int | None:
    """The size of the Ogg page at the start of ``buffer``, once its header is there."""
    if len(buffer) < PAGE_HEADER or len(buffer) < PAGE_HEADER + buffer[26]:
        return None
    segments = buffer[26]
    return PAGE_HEADER + segments + sum(buffer[PAGE_HEADER:PAGE_HEADER + segments])


def stream_samples(data: bytes) -> int:
    """Samples at 48 kHz in a whole Ogg Opus file's pages (up to the first byte that
    does not begin a whole page: the decoder reads no further either).

    What a :class:`Counter` fed those pages counts, in a few array passes: a file of
    hundreds of thousands of packets (1 MB of empty ones declares ten hours) is counted
    in milliseconds, not a second or more of a Python loop per packet."""
    lacings, starts = [], []  # per page: its lacing values, where its data begins
    at = 0
    while data[at:at + 4] == b"OggS":
        size = page_size(data[at:at + PAGE_HEADER + 255])
        if size is None or at + size > len(data):
            break
        segments = data[at + 26]
        lacings.append(np.frombuffer(data, np.uint8, segments, at + PAGE_HEADER))
        starts.append(at + PAGE_HEADER + segments)
        at += size
    lacing = np.concatenate(lacings) if lacings else np.zeros(0, np.uint8)
    return _packets_samples(data, lacing, lacings, starts) if len(lacing) else 0


def _packets_samples(data: bytes, lacing: NDArray[np.uint8], pages: list[NDArray[np.uint8]],
                     starts: list[int]) -> int:
    """The audio packets' samples, from every segment's lacing value (in file order)."""
    sizes = lacing.astype(np.int64)
    # Where each segment's bytes begin: its page's data start plus the segments before it.
    counts = [len(page) for page in pages]
    before = np.cumsum(sizes) - sizes  # bytes of all earlier segments, of any page
    page_before = np.cumsum([0, *(int(page.sum()) for page in pages[:-1])])
    offsets = before + np.repeat(np.asarray(starts, dtype=np.int64) - page_before, counts)
    # A packet begins at the first segment and after every segment shorter than 255.
    begins = np.concatenate(([True], sizes[:-1] < 255))
    first = np.flatnonzero(begins)[_HEADER_PACKETS:]  # OpusHead and OpusTags carry no audio
    if not len(first):
        return 0
    return int(_toc_samples(data, offsets[first], sizes[first]).sum())


def _toc_samples(data: bytes, offsets: NDArray[np.int64], sizes: NDArray[np.int64]
                 ) -> NDArray[np.int64]:
    """:func:`packet_samples` of packets at ``offsets`` whose first segments have
    ``sizes`` bytes (a packet of 0 is empty; of 1, its TOC byte alone)."""
    raw = np.frombuffer(data, np.uint8)
    toc = raw[np.minimum(offsets, len(raw) - 1)].astype(np.int64)
    second = raw[np.minimum(offsets + 1, len(raw) - 1)].astype(np.int64)
    config, code = toc >> 3, toc & 3
    frame = _FRAME_OF_CONFIG[config]
    frames = np.where(code == 0, 1, np.where(code < 3, 2,
                                             np.where(sizes > 1, second & 0x3F, 0)))
    samples = np.minimum(frames * frame, MAX_PACKET)
    return np.where(sizes == 0, MAX_PACKET, samples)
