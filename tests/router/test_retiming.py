"""A moved stream's clock (router.retiming): the client's audio counted from the first
bytes of each masked message, and a new pod's messages moved on by it."""

from __future__ import annotations

import os

import msgpack
import numpy as np
import pytest

from asrpool.common import protocol
from asrpool.router import frames, proxying, relaying, retiming


def client_frame(message: dict[str, object], **packing: bool) -> tuple[bytes, int]:
    """A client's masked frame of ``message`` and where its payload starts."""
    data = frames.frame(frames.BINARY, msgpack.packb(message, **packing), os.urandom(4))
    got = frames.header(data, 0)
    assert got is not None
    return data, got[2]


@pytest.mark.parametrize("samples", [0, 1, 15, 16, 1920, 24000, 70000])
@pytest.mark.parametrize("single", [True, False])
def test_an_audio_messages_samples_are_read_from_its_first_bytes(samples: int,
                                                                 single: bool) -> None:
    pcm = np.linspace(-1, 1, samples, dtype=np.float32).tolist()
    data, start = client_frame({"type": "Audio", "pcm": pcm}, use_single_float=single)
    assert retiming.audio_samples(data, start) == samples


@pytest.mark.parametrize("message", [{"type": "Marker", "id": 7}, {"type": "Init"},
                                     {"type": "Audio"}, {"pcm": [0.0] * 4}])
def test_other_messages_count_no_audio(message: dict[str, object]) -> None:
    assert retiming.audio_samples(*client_frame(message)) == 0


def test_a_message_whose_start_is_not_in_the_read_counts_nothing() -> None:
    data, start = client_frame({"type": "Audio", "pcm": [0.5] * 1920})
    assert retiming.audio_samples(data[:start + 3], start) == 0


def test_a_new_pods_times_and_steps_go_on_from_the_streams_clock() -> None:
    later = 3 * 24000 + 960  # 3.04 s of audio before the move
    word = msgpack.unpackb(retiming.retimed(
        msgpack.packb({"type": "Word", "text": "hi", "start_time": 0.48}), later))
    assert word == {"type": "Word", "text": "hi", "start_time": 3.52}
    end = msgpack.unpackb(retiming.retimed(
        msgpack.packb({"type": "EndWord", "stop_time": 0.8}), later))
    assert end == {"type": "EndWord", "stop_time": 3.84}
    step = msgpack.unpackb(retiming.retimed(
        msgpack.packb({"type": "Step", "step_idx": 2, "prs": [0.1], "buffered_pcm": 0}), later))
    assert step["step_idx"] == 2 + 38  # whole frames of 1920 samples
    marker = msgpack.packb({"type": "Marker", "id": 1})
    assert msgpack.unpackb(retiming.retimed(marker, later)) == {"type": "Marker", "id": 1}
    assert retiming.retimed(b"\xc1 not msgpack", later) == b"\xc1 not msgpack"


def test_a_new_pods_flow_is_cut_into_whole_frames_across_reads() -> None:
    flow = retiming.PodFrames(1000)
    one = frames.frame(frames.BINARY, b"x" * 300)
    ping = frames.frame(frames.PING, b"p")
    data = one + ping + one
    got: list[tuple[int, bytes]] = []
    for cut in range(0, len(data), 7):
        more, fault = flow.feed(data[cut:cut + 7])
        assert fault == ""
        got += more
    assert got == [(frames.BINARY, b"x" * 300), (frames.PING, b"p"), (frames.BINARY, b"x" * 300)]


@pytest.mark.parametrize("bad", [
    frames.frame(frames.BINARY, b"x" * 1001),  # over the limit, refused from its header
    frames.frame(frames.BINARY, b"x", b"abcd"),  # masked
    bytes([0x02, 0x01]) + b"x",  # a first fragment
    bytes([0x81, 0x01]) + b"x",  # text
])
def test_a_new_pod_that_breaks_the_rules_is_told(bad: bytes) -> None:
    got, fault = retiming.PodFrames(1000).feed(bad)
    assert got == [] and "no moved stream takes" in fault


@pytest.mark.parametrize(("code", "close"), [("draining", 1012), ("overloaded", 1013)])
def test_a_pods_error_that_ends_a_stream_for_its_own_reasons_is_found(code: str,
                                                                       close: int) -> None:
    word = frames.frame(frames.BINARY, msgpack.packb({"type": "Word", "text": "Error",
                                                      "start_time": 1.0}))
    error = frames.frame(frames.BINARY, protocol.error("server shutting down",
                                                       protocol.ErrorCode(code)))
    at, end = relaying._shed_at(word + error + frames.close_frame(close)) or (0, None)
    assert (at, end) == (len(word), proxying.PodShed(error, code, close))


@pytest.mark.parametrize("code", ["too_large", "idle_timeout", "internal"])
def test_other_errors_end_the_stream_as_ever(code: str) -> None:
    error = frames.frame(frames.BINARY, protocol.error("no", protocol.ErrorCode(code)))
    assert relaying._shed_at(error) is None
    assert relaying._shed_at(error[:-1]) is None  # not whole: passed on as ever


@pytest.mark.parametrize("mid", [0, 7, -3, 2**40])
def test_a_client_markers_id_is_read_from_its_first_bytes(mid: int) -> None:
    assert retiming.marker_id(*client_frame({"type": "Marker", "id": mid})) == mid


@pytest.mark.parametrize("message", [{"type": "Audio", "pcm": [0.0] * 4}, {"type": "Init"},
                                     {"type": "Word", "text": "Marker"},
                                     {"type": "Marker", "id": "seven"},
                                     {"type": "Marker", "id": True}])
def test_other_messages_are_no_marker(message: dict[str, object]) -> None:
    assert retiming.marker_id(*client_frame(message)) is None


def test_a_pods_marker_is_known_by_its_first_bytes() -> None:
    from asrpool.server import events

    reply = protocol.encode(events.to_message(events.Marker(9)))
    assert reply.startswith(retiming.MARKER_REPLY)
    word = protocol.encode(events.to_message(events.Word("Marker", 1.0)))
    assert not word.startswith(retiming.MARKER_REPLY)
