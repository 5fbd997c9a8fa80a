"""A realtime session's audio, for its key: the seconds each transcribed turn's event
says, read by the router from the event's first bytes (the pod writes the usage before
the transcript; tests/router/test_realtime.py holds a real pod's events to it)."""

from __future__ import annotations

from asrpool.common import realtime_events
from asrpool.router import dialects

COMPLETED = "conversation.item.input_audio_transcription.completed"


def _sent(kind: str, **fields: object) -> bytes:
    """An event as a pod sends it: compact JSON, its fields in this order."""
    return realtime_events.encode(realtime_events.event(kind, **fields))


def _completed(seconds: float, transcript: str) -> bytes:
    return _sent(COMPLETED, item_id=realtime_events.new_id("item"), content_index=0,
                 usage={"type": "duration", "seconds": seconds}, transcript=transcript)


def test_a_turns_seconds_are_read_from_its_first_bytes_whatever_its_transcript() -> None:
    before = b"\x81\x7e\x00\x00"  # where the event starts in a read: after a frame header
    for seconds, transcript in ((2.0, "hello"), (0.08, ""), (3600.5, "word " * 5000)):
        data = before + _completed(seconds, transcript)
        assert dialects.turn_seconds(data, len(before)) == seconds


def test_other_events_and_cut_reads_count_nothing() -> None:
    delta = _sent(COMPLETED.replace("completed", "delta"), item_id="item_1", delta="hi")
    assert dialects.turn_seconds(delta, 0) == 0.0
    whole = _completed(2.5, "hello")
    at = whole.index(b'"seconds":')
    for cut in (40, at, at + len(b'"seconds":2')):  # a read that ends inside the usage
        assert dialects.turn_seconds(whole[:cut], 0) == 0.0
    assert dialects.turn_seconds(whole, 1) == 0.0  # not where an event starts
