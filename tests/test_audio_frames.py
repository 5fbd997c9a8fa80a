"""The Audio frame's fast reader (``protocol.audio_samples``) against the full
MessagePack decoder: on every frame either reads, both give the same samples to the bit,
or the same error, whatever the float width, key order, array header or damage."""

from __future__ import annotations

import math
import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from asrpool.common import protocol

SAMPLES = st.lists(st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1.0, max_value=1.0, width=32),
    st.sampled_from([0.0, -0.0, 1e300, -1e300, 3e38, 16.0, 16.000001, math.nan])),
    min_size=0, max_size=3_000)
FLOAT32_MAX = float(np.finfo(np.float32).max)  # larger doubles pack only as float64


def outcome(decode: object, frame: bytes) -> tuple[str, bytes | str]:
    """What a decoder makes of a frame: its samples' bytes, or its error."""
    try:
        message = decode(frame)  # type: ignore[operator]
    except protocol.ProtocolError as exc:
        return f"error {exc.code}", str(exc)
    if message["type"] != "Audio":
        return message["type"], repr(message)
    pcm = message["pcm"]
    assert pcm.dtype == np.float32 and pcm.ndim == 1 and pcm.flags.c_contiguous
    return "Audio", pcm.tobytes()


def both_agree(frame: bytes) -> tuple[str, bytes | str]:
    fast = outcome(protocol.decode_client, frame)
    assert fast == outcome(protocol.decode_unpacked, frame)
    return fast


@given(samples=SAMPLES, single=st.booleans(), pcm_first=st.booleans())
def test_packed_frames_read_the_same_both_ways(samples: list[float], single: bool,
                                               pcm_first: bool) -> None:
    body = {"pcm": samples, "type": "Audio"} if pcm_first else {"type": "Audio", "pcm": samples}
    single = single and not any(math.isfinite(v) and abs(v) > FLOAT32_MAX for v in samples)
    frame = msgpack.packb(body, use_single_float=single)
    both_agree(frame)
    if samples:  # the fast reader took it (an empty array goes the full way)
        assert protocol.audio_samples(frame) is not None


@given(samples=st.lists(st.floats(-1, 1, width=32), min_size=1, max_size=40),
       cut=st.integers(0, 400), junk=st.binary(min_size=1, max_size=3))
def test_damaged_frames_fail_or_pass_the_same_both_ways(samples: list[float], cut: int,
                                                        junk: bytes) -> None:
    frame = msgpack.packb({"type": "Audio", "pcm": samples}, use_single_float=True)
    both_agree(frame[:min(cut, len(frame) - 1)])  # truncated
    both_agree(frame + junk)  # trailing bytes
    position = cut % len(frame)
    both_agree(frame[:position] + junk[:1] + frame[position + 1:])  # one byte changed


@pytest.mark.parametrize("body", [
    {"type": "Audio", "pcm": [0.5, 1, -0.25]},  # an integer among floats
    {"type": "Audio", "pcm": [0.5, True]},
    {"type": "Audio", "pcm": [0.5, "x"]},
    {"type": "Audio", "pcm": [0.5, [0.1]]},
    {"type": "Audio", "pcm": b"\x00\x00\x80\x3f"},
    {"type": "Audio", "pcm": [0.5], "extra": 1},
    {"type": "Audio", "pcm": []},
    {"type": "Marker", "id": 3},
])
def test_other_shapes_go_the_full_way_with_its_errors(body: dict[str, object]) -> None:
    frame = msgpack.packb(body, use_single_float=True)
    assert protocol.audio_samples(frame) is None
    both_agree(frame)


@pytest.mark.parametrize(("count", "head"), [(15, b"\x9f"), (16, b"\xdc\x00\x10"),
                                             (65_536, b"\xdd\x00\x01\x00\x00")])
def test_every_array_header_is_read(count: int, head: bytes) -> None:
    frame = msgpack.packb({"type": "Audio", "pcm": [0.25] * count}, use_single_float=True)
    assert head + b"\xca" in frame[:24]
    assert both_agree(frame) == ("Audio", np.full(count, 0.25, np.float32).tobytes())


def test_a_count_that_disagrees_with_the_bytes_is_malformed() -> None:
    """A header that claims one element more than the frame holds."""
    frame = b"\x82\xa4type\xa5Audio\xa3pcm\x92" + b"\xca" + struct.pack(">f", 0.5)
    assert protocol.audio_samples(frame) is None
    assert both_agree(frame)[0] == "error malformed"
