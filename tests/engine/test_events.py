"""Word assembly follows Kyutai's moshi-server token rules exactly."""

import msgpack
import numpy as np

from asrpool.common import protocol
from asrpool.server import events as ev


def decoder(delay: int = 2) -> ev.WordDecoder:
    return ev.WordDecoder(delay, lambda tokens: "-".join(map(str, tokens)))


def feed_all(dec: ev.WordDecoder, tokens: list[int]) -> list[ev.Event]:
    out: list[ev.Event] = []
    for token in tokens:
        out += dec.feed(token)
    return out


def test_tokens_before_the_delay_are_ignored() -> None:
    assert feed_all(decoder(delay=3), [10, 11]) == []


def test_padding_closes_a_word_and_end_of_padding_ends_it() -> None:
    # steps:            1  2   3   4  5  6   7  8
    events = feed_all(decoder(), [3, 10, 11, 3, 0, 12, 0, 3])
    assert events == [
        ev.Word("10-11", 0.0),
        ev.EndWord(stop_time=(5 - 2) / 12.5),
        ev.Word("12", (5 - 2) / 12.5),
        ev.EndWord(stop_time=(7 - 2) / 12.5),
    ]


def test_end_of_padding_without_a_word_only_moves_the_start_time() -> None:
    events = feed_all(decoder(), [3, 0, 0, 20, 3])
    assert events == [ev.Word("20", (3 - 2) / 12.5)]


def test_marker_is_due_after_pending_frames_and_the_delay() -> None:
    dec = decoder(delay=2)
    feed_all(dec, [3, 3])
    dec.add_marker(7, frames_pending=1)
    assert feed_all(dec, [3, 3]) == []
    assert feed_all(dec, [3]) == [ev.Marker(7)]


def test_reset_forgets_words_and_markers() -> None:
    dec = decoder()
    feed_all(dec, [3, 10, 11])
    dec.add_marker(1, 0)
    dec.reset()
    assert feed_all(dec, [3, 3, 3, 3]) == []
    assert dec.step_idx == 4


def test_messages_have_the_wire_shape() -> None:
    assert ev.to_message(ev.Word("hi", 0.5)) == {"type": "Word", "text": "hi", "start_time": 0.5}
    assert ev.to_message(ev.EndWord(1.0)) == {"type": "EndWord", "stop_time": 1.0}
    assert ev.to_message(ev.Step(4, (0.1, 0.9)), buffered_pcm=1920) == {
        "type": "Step", "step_idx": 4, "prs": [0.1, 0.9], "buffered_pcm": 1920}
    assert ev.to_message(ev.Marker(3)) == {"type": "Marker", "id": 3}


def test_step_probabilities_are_float32_and_times_float64_on_the_wire() -> None:
    """As moshi-server packs them (prs: Vec<f32>, start_time and stop_time: f64); a
    client comparing bytes saw float64 prs here."""
    step = protocol.encode(ev.to_message(ev.Step(4, (0.1, 0.9)), buffered_pcm=1920))
    assert step.count(b"\xca") == 2 and b"\xcb" not in step  # msgpack float 32, float 64
    assert msgpack.unpackb(step)["prs"] == [float(np.float32(0.1)), float(np.float32(0.9))]
    word = protocol.encode(ev.to_message(ev.Word("hi", 0.5)))
    assert b"\xcb" in word and msgpack.unpackb(word)["start_time"] == 0.5
