"""``bench capacity --input opus-20ms``: sphn's 40 ms packets split into 20 ms frames, one
to a page (four messages per step), decoding to the very samples of the 40 ms pages."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from numpy.typing import NDArray

from asrpool.bench import intake, oggfiles
from asrpool.server import inputs


def decoded(bank: list[bytes]) -> NDArray[np.float32]:
    decoder = inputs.StreamInput().opus_decoder()
    return np.concatenate([decoder.decode(msgpack.unpackb(message)["data"], 10**9)
                           for message in bank])


def test_20_ms_pages_are_four_per_step_and_decode_to_the_40_ms_pages_samples() -> None:
    forty, twenty = intake.OpusIntake(1, 12), intake.OpusIntake(1, 12, one_packet_pages=True)
    assert (forty.messages_per_step, twenty.messages_per_step) == (2, 4)
    for message in twenty.bank[1:]:  # the first carries the headers
        data = msgpack.unpackb(message)["data"]
        assert data[26] == 1 and data[28] & 3 == 0  # one segment: one single-frame packet
    assert np.array_equal(decoded(forty.bank), decoded(twenty.bank))


def test_each_code_of_two_frames_splits_and_others_are_refused() -> None:
    toc = 27 << 3  # CELT super-wideband, 20 ms
    assert oggfiles.single_frames(bytes([toc]) + b"ab") == [bytes([toc]) + b"ab"]
    assert oggfiles.single_frames(bytes([toc | 1]) + b"abcd") == [bytes([toc]) + b"ab",
                                                                 bytes([toc]) + b"cd"]
    assert oggfiles.single_frames(bytes([toc | 2, 1]) + b"abc") == [bytes([toc]) + b"a",
                                                                   bytes([toc]) + b"bc"]
    long_first = bytes([toc | 2, 252, 1]) + b"x" * 256 + b"y"  # 252 + 4 x 1 bytes
    assert oggfiles.single_frames(long_first) == [bytes([toc]) + b"x" * 256,
                                                  bytes([toc]) + b"y"]
    with pytest.raises(ValueError, match="odd"):
        oggfiles.single_frames(bytes([toc | 1]) + b"abc")
    with pytest.raises(ValueError, match="code 3"):
        oggfiles.single_frames(bytes([toc | 3, 2]) + b"ab")


@pytest.mark.parametrize("steps", [12, 110])  # sphn's writer held back 4 pages at 110
def test_every_step_has_a_full_steps_pages(steps: int) -> None:
    """A step short of its pages starves the streams (a laned bench waited forever)."""
    for one_packet_pages in (False, True):
        opus = intake.OpusIntake(1, steps, one_packet_pages=one_packet_pages)
        pages = 4 if one_packet_pages else 2
        assert all(len(opus.messages(step)) == pages for step in range(steps + 2))
