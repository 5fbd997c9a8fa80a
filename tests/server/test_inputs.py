"""A stream's audio input: Ogg pages framed and checked, Opus decoded, no mixing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sphn

from asrpool.common import protocol
from asrpool.server import inputs

RATE = protocol.SAMPLE_RATE


def _pages(seconds: float = 2.0) -> list[bytes]:
    t = np.arange(int(seconds * RATE)) / RATE
    pcm = (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
    writer = sphn.OpusStreamWriter(RATE)
    return [bytes(writer.append_pcm(pcm[i:i + 1920])) for i in range(0, len(pcm), 1920)]


def _decode(pieces: list[bytes]) -> np.ndarray:
    decoder = inputs.OpusDecoder()
    return np.concatenate([decoder.decode(piece) for piece in pieces])


def test_our_crc_agrees_with_libogg() -> None:
    data = b"".join(_pages())
    pages = inputs.OggPages().feed(data)
    assert len(pages) > 20 and b"".join(pages) == data
    assert all(int.from_bytes(p[22:26], "little") == inputs.ogg_crc(p) for p in pages)


def _bitwise_ogg_crc(page: bytes) -> int:
    """Ogg's CRC the plain way, a bit at a time (the reference for the zlib-based one)."""
    crc = 0
    for byte in page[:22] + bytes(4) + page[26:]:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7 if crc & 0x80000000 else crc << 1) & 0xFFFFFFFF
    return crc


@pytest.mark.parametrize("size", [26, 27, 28, 300, 65_307])
def test_our_crc_agrees_with_the_bitwise_definition(size: int) -> None:
    rng = np.random.default_rng(size)
    for _ in range(5):
        page = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert inputs.ogg_crc(page) == _bitwise_ogg_crc(page)


@pytest.mark.parametrize("size", [1, 37, 1000])
def test_pages_split_anywhere_decode_as_whole_pages(size: int) -> None:
    pages = _pages()
    data = b"".join(pages)
    whole = _decode(pages)
    assert len(whole) == 2 * RATE
    np.testing.assert_array_equal(_decode([data[i:i + size] for i in range(0, len(data), size)]),
                                  whole)


def test_many_pages_in_one_message() -> None:  # sphn alone fails on these
    assert len(_decode([b"".join(_pages(30.0))])) == 30 * RATE


@pytest.mark.parametrize("cut", [5, 20, 27, 60])
def test_a_truncated_page_is_an_error(cut: int) -> None:
    pages = _pages()
    with pytest.raises(protocol.ProtocolError, match="truncated") as caught:
        _decode([*pages[:2], pages[2][:cut], *pages[3:]])
    assert caught.value.code == "bad_audio"


def test_a_corrupt_page_is_an_error() -> None:
    data = bytearray(b"".join(_pages()))
    data[-20] ^= 0xFF  # in the last page, which no capture pattern follows
    with pytest.raises(protocol.ProtocolError, match="CRC"):
        _decode([bytes(data)])


def test_stereo_and_non_ogg_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "stereo.opus"
    sphn.write_opus(str(path), np.zeros((2, RATE), dtype=np.float32), RATE)
    with pytest.raises(protocol.ProtocolError, match="2 channels"):
        _decode([path.read_bytes()])
    with pytest.raises(protocol.ProtocolError, match="not an Ogg page"):
        _decode([b"RIFF0000WAVE"])


def test_audio_and_opus_are_not_mixed() -> None:
    stream = inputs.StreamInput()
    stream.pcm({"type": "Audio", "pcm": np.zeros(10, dtype=np.float32)})
    with pytest.raises(protocol.ProtocolError) as caught:
        stream.pcm({"type": "OggOpus", "data": _pages()[0]})
    assert caught.value.code == "mixed_audio"


def test_a_decode_with_room_stops_at_whole_pages_and_the_rest_waits_encoded() -> None:
    data = b"".join(_pages(10.0))
    whole = _decode([data])
    decoder = inputs.OpusDecoder()
    first = decoder.decode(data, room=RATE)
    assert 0 < len(first) <= RATE and decoder.pending > 0
    parts = [first]
    while decoder.pending:
        parts.append(decoder.decode(b"", room=RATE))
        assert len(parts[-1]) <= RATE
    np.testing.assert_array_equal(np.concatenate(parts), whole)
