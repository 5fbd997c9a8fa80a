"""OpenAI's Realtime transcription protocol as a pod's session keeps it (server.realtime):
every event it sends validates strictly as the official SDK's own types, a commit is a
marker whose words are the turn's, a clear drops its words, and bad input is an ``error``
naming what was wrong, the session kept."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
from openai.types.beta.realtime.realtime_server_event import (
    RealtimeServerEvent as BetaServerEvent,
)
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from pydantic import TypeAdapter

from asrpool.server import realtime

GA = TypeAdapter(RealtimeServerEvent)
BETA = TypeAdapter(BetaServerEvent)


def send(to: realtime.Session, **message: Any) -> tuple[list[dict[str, Any]],
                                                         list[realtime.Action]]:
    events, actions = to.receive(json.dumps(message))
    for event in events:
        if not to.beta:
            GA.validate_python(event)  # strictly, as the SDK's models define them
    return events, actions


def append(session: realtime.Session, seconds: float) -> list[realtime.Action]:
    pcm = (np.sin(np.arange(int(24_000 * seconds)) / 7) * 9000).astype("<i2")
    events, actions = send(session, type="input_audio_buffer.append",
                           audio=base64.b64encode(pcm.tobytes()).decode())
    assert events == []
    return actions


def test_a_session_opens_with_its_whole_transcription_session() -> None:
    (created,) = realtime.Session(beta=False).opened()
    GA.validate_python(created)
    assert created["type"] == "session.created"
    assert created["session"]["audio"]["input"]["format"] == {"type": "audio/pcm",
                                                               "rate": 24000}
    assert created["session"]["audio"]["input"]["turn_detection"] is None


def test_an_update_is_answered_with_the_session_it_makes() -> None:
    session = realtime.Session(beta=False)
    (updated,), _ = send(session, type="session.update", event_id="mine", session={
        "type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None,
            "transcription": {"model": "kyutai/stt-1b-en_fr", "language": "fr"}}}})
    assert updated["type"] == "session.updated" and updated["event_id"] != "mine"
    assert updated["session"]["audio"]["input"]["transcription"] == {
        "model": "kyutai/stt-1b-en_fr", "language": "fr", "prompt": None}


def test_audio_is_decoded_from_base64_pcm16() -> None:
    session = realtime.Session(beta=False)
    pcm = np.array([0, 16384, -32768, 32767], dtype="<i2")
    _, (action,) = send(session, type="input_audio_buffer.append",
                        audio=base64.b64encode(pcm.tobytes()).decode())
    assert isinstance(action, realtime.Audio)
    assert action.pcm.dtype == np.float32
    assert action.pcm.tolist() == [0.0, 0.5, -1.0, 32767 / 32768]


def said(session: realtime.Session, message: dict[str, Any]) -> list[dict[str, Any]]:
    """The events for a stream message that does nothing to the stream."""
    events, actions = session.result(message)
    assert actions == []
    return events


def test_a_commit_marks_the_turn_and_its_words_come_as_deltas_then_complete() -> None:
    session = realtime.Session(beta=False, delay=6)
    append(session, 0.5)
    assert said(session, {"type": "Word", "text": "hello", "start_time": 0.1}) == []
    events, (pad, mark, silence) = send(session, type="input_audio_buffer.commit")
    assert isinstance(mark, realtime.Mark)
    assert isinstance(pad, realtime.Audio) and isinstance(silence, realtime.Audio)
    assert len(pad.pcm) == 1920 - 12_000 % 1920  # the last partial frame, filled
    assert len(silence.pcm) == 6 * 1920 and not silence.pcm.any()  # the model's delay
    kinds = [e["type"] for e in events]
    assert kinds == ["input_audio_buffer.committed", "conversation.item.added",
                     "conversation.item.done",
                     "conversation.item.input_audio_transcription.delta"]
    item_id = events[0]["item_id"]
    assert events[0]["previous_item_id"] is None and events[3]["delta"] == "hello"
    (delta,) = said(session, {"type": "Word", "text": "world", "start_time": 0.3})
    assert (delta["item_id"], delta["delta"]) == (item_id, " world")
    assert said(session, {"type": "Step", "step_idx": 3, "prs": [0.0] * 4,
                          "buffered_pcm": 0}) == []  # no turn detection: Steps say nothing
    (completed,) = said(session, {"type": "Marker", "id": mark.marker_id})
    GA.validate_python(delta)
    GA.validate_python(completed)
    assert completed["transcript"] == "hello world" and completed["item_id"] == item_id
    assert completed["usage"] == {"type": "duration", "seconds": 0.5}
    # The next turn names this one as its previous item.
    append(session, 0.2)
    events, _ = send(session, type="input_audio_buffer.commit")
    assert events[0]["previous_item_id"] == item_id


def test_a_clear_drops_the_words_of_the_audio_before_it() -> None:
    session = realtime.Session(beta=False)
    append(session, 0.5)
    (cleared,), (mark,) = send(session, type="input_audio_buffer.clear")
    assert cleared["type"] == "input_audio_buffer.cleared" and isinstance(mark, realtime.Mark)
    assert said(session, {"type": "Word", "text": "dropped", "start_time": 0.1}) == []
    assert said(session, {"type": "Marker", "id": mark.marker_id}) == []
    append(session, 0.5)
    said(session, {"type": "Word", "text": "kept", "start_time": 0.6})
    _, (_, commit) = send(session, type="input_audio_buffer.commit")  # no delay to flush
    assert isinstance(commit, realtime.Mark)
    (completed,) = said(session, {"type": "Marker", "id": commit.marker_id})
    assert completed["transcript"] == "kept"


def test_the_beta_form_names_its_events_as_beta_clients_read_them() -> None:
    session = realtime.Session(beta=True)
    (created,) = session.opened()
    assert created["type"] == "transcription_session.created"
    (updated,), _ = send(session, type="transcription_session.update", session={
        "input_audio_format": "pcm16", "turn_detection": None,
        "input_audio_transcription": {"model": "whisper-1"}})
    assert updated["type"] == "transcription_session.updated"
    append(session, 0.2)
    events, _ = send(session, type="input_audio_buffer.commit")
    assert [e["type"] for e in events] == ["input_audio_buffer.committed",
                                           "conversation.item.created"]
    for event in events:
        BETA.validate_python(event)


@pytest.mark.parametrize(("message", "code", "param"), [
    ("{not json", "invalid_json", None),
    ('["a list"]', "invalid_event", None),
    ('{"no": "type"}', "invalid_event", "type"),
    ('{"type": "response.create"}', "invalid_value", "type"),
    ('{"type": "input_audio_buffer.append", "audio": "%%%"}', "invalid_value", "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "AA=="}', "invalid_value", "audio"),
    ('{"type": "input_audio_buffer.append", "audio": 5}', "invalid_type", "audio"),
    ('{"type": "input_audio_buffer.commit", "event_id": "e1"}',
     "input_audio_buffer_commit_empty", None),
    ('{"type": "session.update", "session": {"type": "transcription", "bogus": 1}}',
     "unknown_parameter", "session.bogus"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"format": {"type": "audio/opus"}}}}}', "invalid_value", "session.audio.input.format.type"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"format": {"type": "audio/pcmu", "rate": 24000}}}}}', "invalid_value",
     "session.audio.input.format.rate"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"format": {"type": "audio/pcm", "rate": 16000}}}}}', "invalid_value",
     "session.audio.input.format.rate"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"turn_detection": {"type": "server_vad"}}}}}', "invalid_value",
     "session.audio.input.turn_detection"),
    ('{"type": "session.update", "session": {"type": "realtime"}}', "invalid_value",
     "session.type"),
])
def test_bad_input_is_an_error_naming_it_and_the_session_goes_on(
        message: str, code: str, param: str | None) -> None:
    session = realtime.Session(beta=False)
    events, actions = session.receive(message)
    (error,) = events
    GA.validate_python(error)
    assert actions == []
    assert (error["error"]["code"], error["error"]["param"]) == (code, param), error
    assert error["error"]["message"]
    if '"event_id"' in message:
        assert error["error"]["event_id"] == "e1"
    # Nothing was taken: a good turn goes on as ever.
    append(session, 0.2)
    events, _ = send(session, type="input_audio_buffer.commit")
    assert events[0]["type"] == "input_audio_buffer.committed"


def test_a_refused_update_changes_nothing() -> None:
    session = realtime.Session(beta=False)
    send(session, type="session.update", session={"type": "transcription", "audio": {
        "input": {"transcription": {"model": "m"}, "format": {"type": "audio/flac"}}}})
    assert session.transcription["model"] is None
