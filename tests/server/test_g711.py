"""G.711 for OpenAI's Realtime clients (server.g711): the standard's tables (held to
Python's own ``audioop`` where it still ships), 8 kHz brought to 24 kHz the same however
a client cuts its appends, and a session that takes ``audio/pcmu``/``g711_alaw``."""

from __future__ import annotations

import base64
import json
import warnings

import numpy as np
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from pydantic import TypeAdapter

from asrpool.server import g711, realtime

with warnings.catch_warnings():  # deprecated, and there until 3.13 (we run on < 3.13)
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop


def test_the_tables_are_the_standards() -> None:
    every = bytes(range(256))
    for kind, decode in (("audio/pcmu", audioop.ulaw2lin), ("audio/pcma", audioop.alaw2lin)):
        expected = np.frombuffer(decode(every, 2), dtype="<i2")
        assert (g711.TABLES[kind] == expected).all(), kind


def tone(seconds: float, hz: float, rate: int, delay: int = 0) -> np.ndarray:
    t = (np.arange(int(rate * seconds)) - delay) / rate
    return np.sin(2 * np.pi * hz * t) * 0.25


def test_a_tone_comes_out_at_24_khz_however_the_appends_are_cut() -> None:
    coded = audioop.lin2ulaw((tone(1.0, 440, 8000) * 32767).astype("<i2").tobytes(), 2)
    whole = g711.Decoder("audio/pcmu").decode(coded)
    cut = g711.Decoder("audio/pcmu")
    parts = np.concatenate([cut.decode(coded[i:i + 137]) for i in range(0, len(coded), 137)])
    assert len(whole) == 24_000
    assert np.array_equal(whole, parts)
    # The same tone at 24 kHz, behind by the filter's half length; mu-law's own error.
    expected = tone(1.0, 440, 24_000, delay=(g711.TAPS - 1) // 2)
    assert np.abs(whole - expected)[100:-100].max() < 0.01


def test_nothing_above_the_telephone_band_is_made_up() -> None:
    """The images the zeros between samples make (at 8 kHz less the tone) are filtered out."""
    coded = audioop.lin2alaw((tone(1.0, 3000, 8000) * 32767).astype("<i2").tobytes(), 2)
    out = g711.Decoder("audio/pcma").decode(coded)
    spectrum = np.abs(np.fft.rfft(out[2400:21600] * np.hanning(19200)))
    hz = np.fft.rfftfreq(19200, 1 / 24_000)
    assert spectrum[hz > 4500].max() < spectrum.max() / 100


def test_a_session_takes_g711_and_says_so() -> None:
    session = realtime.Session(beta=False)
    (updated,), _ = session.receive(json.dumps({"type": "session.update", "session": {
        "type": "transcription", "audio": {"input": {"format": {"type": "audio/pcmu"}}}}}))
    TypeAdapter(RealtimeServerEvent).validate_python(updated)
    assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    coded = audioop.lin2ulaw((tone(0.5, 300, 8000) * 32767).astype("<i2").tobytes(), 2)
    _, (audio,) = session.receive(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(coded).decode()}))
    assert isinstance(audio, realtime.Audio) and len(audio.pcm) == 12_000
    assert session.samples == 12_000  # a turn's usage counts the model's samples


def test_a_beta_session_names_g711_as_beta_does() -> None:
    session = realtime.Session(beta=True)
    (updated,), _ = session.receive(json.dumps({"type": "transcription_session.update",
                                                "session": {"input_audio_format": "g711_alaw"}}))
    assert updated["type"] == "transcription_session.updated"
    assert updated["session"]["input_audio_format"] == "g711_alaw"
    # An update that names no format keeps it.
    (updated,), _ = session.receive(json.dumps({"type": "transcription_session.update",
                                                "session": {"turn_detection": None}}))
    assert updated["session"]["input_audio_format"] == "g711_alaw"
