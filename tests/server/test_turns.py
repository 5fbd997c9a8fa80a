"""Turns from the model's voice activity (server.turns), and a session that commits them
(server.realtime): speech starts and stops where the pause head says, at the times
OpenAI's events carry, and the pod's own flush silence is no speech of the client's."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from pydantic import TypeAdapter

from asrpool.server import realtime, turns

GA = TypeAdapter(RealtimeServerEvent)
SPEECH, PAUSE = 0.1, 0.9  # the pause head's probability (prs[2]) while speaking, pausing


def prs(pause: float) -> list[float]:
    return [0.0, 0.0, pause, 0.0]


def detector(**given: Any) -> turns.Detector:
    return turns.Detector(turns.read({"type": "server_vad", **given}, "turn_detection"))


def changes(detect: turns.Detector, pauses: list[float], first: int = 0) -> list[Any]:
    out = [detect.step(first + n, prs(p)) for n, p in enumerate(pauses)]
    return [(first + n, change) for n, change in enumerate(out) if change is not None]


def test_speech_starts_with_its_padding_and_stops_after_the_silence_it_asks_for() -> None:
    detect = detector(prefix_padding_ms=160, silence_duration_ms=240)
    pauses = [PAUSE] * 5 + [SPEECH] * 4 + [PAUSE, SPEECH] + [PAUSE] * 4
    assert changes(detect, pauses) == [
        (5, turns.Started(5 * 80 - 160)),  # 400 ms, reaching back 160
        (13, turns.Stopped(14 * 80)),  # the third quiet step in a row: 240 ms of pause
    ]


def test_the_next_turns_padding_reaches_back_no_further_than_the_last_turns_end() -> None:
    detect = detector(prefix_padding_ms=1000, silence_duration_ms=0)
    assert changes(detect, [SPEECH, PAUSE, SPEECH, PAUSE], first=20) == [
        (20, turns.Started(20 * 80 - 1000)), (21, turns.Stopped(22 * 80)),
        (22, turns.Started(22 * 80)), (23, turns.Stopped(24 * 80))]


def test_the_threshold_is_on_the_probability_of_speech() -> None:
    eager, strict = detector(threshold=0.3), detector(threshold=0.8)
    assert changes(eager, [0.6]) == [(0, turns.Started(0))]  # speech 0.4 > 0.3
    assert changes(strict, [0.6]) == []


def test_the_pods_own_silence_is_skipped_and_not_counted_in_the_clients_time() -> None:
    detect = detector(prefix_padding_ms=0, silence_duration_ms=0)
    detect.inserted(10, 6)  # a flush: stream steps 10..15 are the pod's silence
    assert changes(detect, [SPEECH] * 6, first=10) == []
    assert changes(detect, [SPEECH], first=16) == [(16, turns.Started(10 * 80))]


@pytest.mark.parametrize(("given", "param"), [
    ({"type": "manual"}, "turn_detection.type"),
    ({"type": "server_vad", "threshold": 2}, "turn_detection.threshold"),
    ({"type": "server_vad", "silence_duration_ms": "long"}, "turn_detection.silence_duration_ms"),
    ({"type": "server_vad", "bogus": 1}, "turn_detection.bogus"),
    ({"type": "semantic_vad", "eagerness": "eager"}, "turn_detection.eagerness"),
    ({"type": "semantic_vad", "threshold": 0.5}, "turn_detection.threshold"),
])
def test_a_turn_detection_it_cannot_serve_is_refused_naming_the_field(
        given: dict[str, Any], param: str) -> None:
    with pytest.raises(turns.Refused) as refused:
        turns.read(given, "turn_detection")
    assert refused.value.param == param


def test_semantic_vad_waits_longer_the_less_eager() -> None:
    waits = [turns.read({"type": "semantic_vad", "eagerness": e}, "t").silence_duration_ms
             for e in ("high", "medium", "low")]
    assert waits == sorted(waits) and waits[0] < waits[-1]


# A session with server VAD.

def vad_session(**detection: Any) -> realtime.Session:
    session = realtime.Session(beta=False, delay=6, voice_activity=True)
    events, _ = session.receive(json.dumps({"type": "session.update", "session": {
        "type": "transcription", "audio": {"input": {"turn_detection": {
            "type": "server_vad", **detection}}}}}))
    (updated,) = events
    GA.validate_python(updated)
    assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    return session


def append(session: realtime.Session, frames: int) -> None:
    pcm = np.full(frames * 1920, 1000, dtype="<i2")
    session.receive(json.dumps({"type": "input_audio_buffer.append",
                                "audio": base64.b64encode(pcm.tobytes()).decode()}))


def step(session: realtime.Session, index: int, pause: float) -> tuple[list[dict[str, Any]],
                                                                      list[realtime.Action]]:
    events, actions = session.result({"type": "Step", "step_idx": index, "prs": prs(pause),
                                      "buffered_pcm": 0})
    for event in events:
        GA.validate_python(event)  # strictly, as the SDK reads them
    return events, actions


def test_a_turn_the_model_ends_is_committed_and_transcribed() -> None:
    session = vad_session(prefix_padding_ms=0, silence_duration_ms=80)
    append(session, 10)
    (started,), _ = step(session, 2, SPEECH)
    assert started["type"] == "input_audio_buffer.speech_started"
    assert started["audio_start_ms"] == 160
    session.result({"type": "Word", "text": "bonjour", "start_time": 0.3})
    events, actions = step(session, 5, PAUSE)
    kinds = [e["type"] for e in events]
    assert kinds == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
                     "conversation.item.added", "conversation.item.done",
                     "conversation.item.input_audio_transcription.delta"]
    item_id = started["item_id"]
    assert {e["item_id"] for e in events if "item_id" in e} == {item_id}
    assert events[0]["audio_end_ms"] == 6 * 80
    # Words come after the model's delay, before the marker is back: the turn takes those
    # said before speech ended (0.48 s of the stream), the buffer the rest.
    (delta,), _ = session.result({"type": "Word", "text": "tout", "start_time": 0.4})
    assert (delta["item_id"], delta["delta"]) == (item_id, " tout")
    assert session.result({"type": "Word", "text": "ensuite", "start_time": 0.56}) == ([], [])
    mark = next(a for a in actions if isinstance(a, realtime.Mark))
    (completed,), _ = session.result({"type": "Marker", "id": mark.marker_id})
    assert (completed["item_id"], completed["transcript"]) == (item_id, "bonjour tout")
    assert session.words == ["ensuite"]
    assert completed["usage"]["seconds"] == 0.48  # the buffer up to where speech ended
    assert session.samples == 10 * 1920 - 480 * 24  # the rest stays in the buffer


def test_the_flush_after_a_turn_is_no_speech() -> None:
    """The commit flushed 6 frames of silence after the 10 of the client's: stream steps
    10..15 are the pod's, and step 16 is the client's 800 ms."""
    session = vad_session(prefix_padding_ms=0, silence_duration_ms=0)
    append(session, 10)
    step(session, 1, SPEECH)
    step(session, 2, PAUSE)  # committed: flushed at stream step 10
    for index in range(10, 16):
        assert step(session, index, SPEECH) == ([], [])
    (started,), _ = step(session, 16, SPEECH)
    assert started["audio_start_ms"] == 800


def test_server_vad_on_a_model_without_a_pause_head_is_refused() -> None:
    session = realtime.Session(beta=False, delay=32, voice_activity=False)
    (error,), _ = session.receive(json.dumps({"type": "session.update", "session": {
        "type": "transcription", "audio": {"input": {"turn_detection": {
            "type": "semantic_vad"}}}}}))
    assert error["error"]["code"] == "invalid_value"
    assert "voice-activity" in error["error"]["message"]
