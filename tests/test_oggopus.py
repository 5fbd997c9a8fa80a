"""A whole Ogg Opus file is counted (``stream_samples``, in array passes) exactly as a
stream's :class:`oggopus.Counter` counts the same pages one packet at a time."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import sphn

from asrpool.bench import oggfiles
from asrpool.common import oggopus
from asrpool_harness.bench import upload_attacks


def _random_page(rng: np.random.Generator, segments: int) -> bytes:
    """A page of random lacing values (255s continue a packet, onto the next page too)
    and random bytes; no CRC (counting reads none)."""
    lacing = rng.choice([0, 1, 2, 3, 7, 120, 254, 255], size=segments).astype(np.uint8)
    header = struct.pack("<4sBBqIIIB", b"OggS", 0, 0, 0, 1, 0, 0, segments)
    return header + lacing.tobytes() + rng.integers(0, 256, int(lacing.sum()),
                                                    dtype=np.uint8).tobytes()


def _counted_page_by_page(data: bytes) -> int:
    counter, at = oggopus.Counter(), 0
    while data[at:at + 4] == b"OggS" and (size := oggopus.page_size(data[at:])) is not None \
            and at + size <= len(data):
        counter.page(data[at:at + size])
        at += size
    return counter.samples


@pytest.mark.parametrize("seed", range(40))
def test_a_file_of_random_pages_counts_as_its_pages_do(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pages = [_random_page(rng, int(rng.integers(0, 256))) for _ in range(int(rng.integers(1, 6)))]
    data = b"".join(pages) + (b"OggS\0" if seed % 3 == 0 else b"")  # a cut page at the end
    assert oggopus.stream_samples(data) == _counted_page_by_page(data)


def test_encoded_files_and_bombs_count_as_their_pages_do(tmp_path: object) -> None:
    pcm = (np.random.default_rng(1).standard_normal(24_000 * 3) * 0.1).astype(np.float32)
    path = f"{tmp_path}/a.opus"
    sphn.write_opus(path, pcm[None], 24_000)
    with open(path, "rb") as file:
        encoded = file.read()
    for data in (encoded, upload_attacks.opus_bomb(0.1), upload_attacks.opus_bomb(0.1, 2, 100),
                 oggfiles.opus_file([bytes([16 << 3 | 3, 1]), b"\x08"] * 300, 960), b"", b"OggS"):
        assert oggopus.stream_samples(data) == _counted_page_by_page(data)
    assert oggopus.stream_samples(upload_attacks.opus_bomb(0.1)) == 360 * oggopus.RATE
