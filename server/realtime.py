"""OpenAI's Realtime API in transcription mode, on one of the pod's streams: the protocol
state of a session, kept pure (client events in; server events, and what to do to the
stream, out), so that :mod:`server.realtimews` only moves bytes.

The shapes are the official ``openai`` SDK's (GA, and the beta form a client asks for
with ``OpenAI-Beta: realtime=v1``). Turns are the client's own commits
(``turn_detection: null``, asrpool's default), or those the model's own voice activity
draws (``server_vad``, ``semantic_vad``: :mod:`server.turns`), each ended by the same
commit. A commit is a marker on the stream, behind which the pod steps the model's
delay of silence, so the turn's last words come without more audio; every word the
model says before the marker comes back is the turn's, sent as a delta, and the
marker's return completes the turn. A clear is a marker too: the words before it are
dropped. Audio is 24 kHz 16-bit PCM, base64, or G.711 (:mod:`server.g711`).
"""

from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import json
from typing import Any

import numpy as np
from numpy.typing import NDArray

from asrpool.common import protocol, realtime_events
from asrpool.server import g711, turns

MIN_COMMIT_SAMPLES = protocol.SAMPLE_RATE // 10  # 100 ms, as OpenAI asks
MAX_APPEND_BYTES = 15 << 20  # of base64, as OpenAI's limit
PCM = "audio/pcm"
FORMATS = (PCM, *g711.TABLES)  # audio/pcm, audio/pcmu, audio/pcma
BETA_FORMATS = {"pcm16": PCM, "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}
Event = realtime_events.Event
new_id = realtime_events.new_id
event = realtime_events.event
error = realtime_events.error


@dataclasses.dataclass(frozen=True)
class Audio:
    """Push these samples to the stream."""

    pcm: NDArray[np.float32]


@dataclasses.dataclass(frozen=True)
class Mark:
    """Push marker ``marker_id``."""

    marker_id: int


Action = Audio | Mark


class Refused(Exception):
    """A client event refused: an ``error`` event, the connection kept."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


@dataclasses.dataclass
class _Pending:
    """A commit (``item_id``) or a clear (``item_id`` empty) whose marker is out. A turn
    that VAD ended ``until`` a stream time (seconds) takes the words said before it; the
    others take every word until their marker is back."""

    marker_id: int
    item_id: str
    words: list[str]
    samples: int
    until: float | None = None

    def takes(self, start_time: float) -> bool:
        return self.until is None or start_time < self.until


class Session:
    """One session's protocol. ``delay``: the model's steps from a frame to its word
    (what a commit flushes); ``voice_activity``: whether the model says when the speaker
    pauses (``Step``'s ``prs``), which server VAD needs."""

    def __init__(self, beta: bool, delay: int = 0, voice_activity: bool = False) -> None:
        self.beta, self.delay, self.voice_activity = beta, delay, voice_activity
        self.transcription: dict[str, Any] = {"model": None, "language": None, "prompt": None}
        self.noise_reduction: dict[str, Any] | None = None
        self.include: list[str] | None = None
        self.appended = 0  # samples the client appended
        self.buffer_start = 0  # of those, where the buffer starts (the last commit or clear)
        self.words: list[str] = []  # heard since then, not yet committed
        self.pending: collections.deque[_Pending] = collections.deque()
        self.previous_item: str | None = None
        self.next_marker = 1
        self.stream_samples = 0  # pushed to the stream: the client's and the pod's silence
        self.detector: turns.Detector | None = None  # with server VAD
        self.speech_item = ""  # the item a started speech will commit
        self.audio_format = PCM
        self.g711: g711.Decoder | None = None  # for G.711 audio

    # What the server says first.

    def opened(self) -> list[Event]:
        kind = "transcription_session.created" if self.beta else "session.created"
        return [event(kind, session=self._session())]

    # Client events.

    def receive(self, text: str) -> tuple[list[Event], list[Action]]:
        """The events to send and the actions on the stream for one client message."""
        client_event_id = None
        try:
            message = _parse(text)
            client_event_id = _event_id(message)
            return self._handle(message)
        except Refused as exc:
            return [error(exc.code, exc.message, exc.param, client_event_id)], []

    def _handle(self, message: dict[str, Any]) -> tuple[list[Event], list[Action]]:
        kind = message["type"]
        if kind == "input_audio_buffer.append":
            return [], [self._pushed(self._append(message))]
        if kind == "input_audio_buffer.commit":
            return self._commit()
        if kind == "input_audio_buffer.clear":
            return self._clear()
        if kind in ("session.update", "transcription_session.update"):
            self._update(message)
            updated = "transcription_session.updated" if self.beta else "session.updated"
            return [event(updated, session=self._session())], []
        raise Refused("invalid_value", f"Invalid value: {kind!r}. Supported values are: "
                      "'session.update', 'transcription_session.update', "
                      "'input_audio_buffer.append', 'input_audio_buffer.commit' and "
                      "'input_audio_buffer.clear'.", "type")

    def _append(self, message: dict[str, Any]) -> Audio:
        audio = message.get("audio")
        if not isinstance(audio, str):
            raise Refused("invalid_type", "Invalid type for 'audio': expected a base64 string.",
                          "audio")
        if len(audio) > MAX_APPEND_BYTES:
            raise Refused("invalid_value", f"'audio' is {len(audio)} bytes of base64, over the "
                          f"{MAX_APPEND_BYTES}-byte limit of one append.", "audio")
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise Refused("invalid_value", "Invalid 'audio'. Expected base64-encoded audio "
                          f"bytes ({self.audio_format}) but got an invalid value.",
                          "audio") from None
        pcm = self._decoded(data)
        self.appended += len(pcm)
        return Audio(pcm)

    def _decoded(self, data: bytes) -> NDArray[np.float32]:
        if self.g711 is not None:
            return self.g711.decode(data)
        if len(data) % 2:
            raise Refused("invalid_value", "Invalid 'audio': 16-bit PCM has an even number "
                          f"of bytes, got {len(data)}.", "audio")
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0

    @property
    def samples(self) -> int:
        """In the buffer: appended since the last commit or clear."""
        return self.appended - self.buffer_start

    def _pushed(self, audio: Audio) -> Audio:
        self.stream_samples += len(audio.pcm)
        return audio

    def _commit(self, ended: tuple[float, int] | None = None) -> tuple[list[Event], list[Action]]:
        """The buffer as a turn: all of it (a client's commit), or (VAD's) up to
        ``ended``: the stream time (seconds) and the client's samples where speech ended."""
        if self.samples < MIN_COMMIT_SAMPLES and ended is None:
            ms = self.samples * 1000 / protocol.SAMPLE_RATE
            raise Refused("input_audio_buffer_commit_empty", "Error committing input audio "
                          "buffer: buffer too small. Expected at least 100ms of audio, but "
                          f"buffer only has {ms:.2f}ms of audio.")
        item_id, self.speech_item = self.speech_item or new_id("item"), ""
        until, end = (None, self.appended) if ended is None else ended
        pending = _Pending(self._marker(), item_id, self.words, end - self.buffer_start, until)
        events = [event("input_audio_buffer.committed", item_id=item_id,
                        previous_item_id=self.previous_item)]
        item = {"id": item_id, "object": "realtime.item", "type": "message",
                "status": "completed", "role": "user",
                "content": [{"type": "input_audio", "transcript": None}]}
        added = ["conversation.item.created"] if self.beta else [
            "conversation.item.added", "conversation.item.done"]
        events += [event(kind, previous_item_id=self.previous_item, item=item)
                   for kind in added]
        events += [self._delta(pending, i) for i in range(len(pending.words))]
        self.pending.append(pending)
        self.previous_item, self.words, self.buffer_start = item_id, [], end
        return events, self._flushed(pending.marker_id)

    def _flushed(self, marker_id: int) -> list[Action]:
        """The stream's last partial frame filled, the marker, then the model's delay of
        silence (the detector skips it: it is none of the client's audio)."""
        frame = protocol.FRAME_SIZE
        pad = Audio(np.zeros(-self.stream_samples % frame, dtype=np.float32))
        self._pushed(pad)
        if self.detector is not None:
            self.detector.inserted(self.stream_samples // frame, self.delay)
        silence = self._pushed(Audio(np.zeros(self.delay * frame, dtype=np.float32)))
        return [action for action in (pad, Mark(marker_id), silence)
                if not isinstance(action, Audio) or len(action.pcm)]

    def _clear(self) -> tuple[list[Event], list[Action]]:
        pending = _Pending(self._marker(), "", self.words, self.samples)
        self.pending.append(pending)
        self.words, self.buffer_start = [], self.appended
        return [event("input_audio_buffer.cleared")], [Mark(pending.marker_id)]

    def _marker(self) -> int:
        self.next_marker += 1
        return self.next_marker - 1

    def _update(self, message: dict[str, Any]) -> None:
        """The whole update, or nothing of it (as OpenAI: a bad field refuses it all)."""
        session = message.get("session")
        if not isinstance(session, dict):
            raise Refused("missing_required_parameter", "Missing required parameter: "
                          "'session'.", "session")
        fields = _beta_fields(session) if message["type"].startswith("transcription_") \
            else _ga_fields(session)
        if fields.get("turn_detection") is not None and not self.voice_activity:
            raise Refused("invalid_value", "This model has no voice-activity head to detect "
                          "turns with: set turn_detection to null and commit each turn with "
                          "input_audio_buffer.commit.", "session.audio.input.turn_detection")
        if "turn_detection" in fields:
            detection = fields["turn_detection"]
            self.detector = None if detection is None else turns.Detector(detection)
        if fields.get("format", self.audio_format) != self.audio_format:
            self.audio_format = fields["format"]
            self.g711 = None if self.audio_format == PCM else g711.Decoder(self.audio_format)
        self.transcription = {**self.transcription, **fields.get("transcription", {})}
        if "noise_reduction" in fields:
            self.noise_reduction = fields["noise_reduction"]
        if "include" in fields:
            self.include = fields["include"]

    # The stream's results.

    def result(self, message: dict[str, Any]) -> tuple[list[Event], list[Action]]:
        """The events for one of the stream's messages (Word, Marker, and with server VAD
        Step), and what to do to the stream (a turn that VAD ends is committed)."""
        kind = message.get("type")
        if kind == "Word" and isinstance(message.get("text"), str):
            start = message.get("start_time")
            return self._word(message["text"], start if isinstance(start, float) else 0.0), []
        if kind == "Marker":
            return self._marker_back(message.get("id")), []
        if kind == "Step" and self.detector is not None:
            return self._step(message)
        return [], []

    def _step(self, message: dict[str, Any]) -> tuple[list[Event], list[Action]]:
        assert self.detector is not None
        prs, step_idx = message.get("prs"), message.get("step_idx")
        if not isinstance(prs, list) or not isinstance(step_idx, int):
            return [], []
        change = self.detector.step(step_idx, prs)
        if isinstance(change, turns.Started):
            self.speech_item = new_id("item")
            return [event("input_audio_buffer.speech_started", item_id=self.speech_item,
                          audio_start_ms=change.audio_start_ms)], []
        if isinstance(change, turns.Stopped):
            stopped = event("input_audio_buffer.speech_stopped", item_id=self.speech_item,
                            audio_end_ms=change.audio_end_ms)
            ended = ((step_idx + 1) * turns.FRAME_MS / 1000,
                     change.audio_end_ms * protocol.SAMPLE_RATE // 1000)
            events, actions = self._commit(ended)
            return [stopped, *events], actions
        return [], []

    def _word(self, text: str, start_time: float) -> list[Event]:
        """A word goes to the first turn out that takes it, else to the buffer."""
        pending = next((p for p in self.pending if p.takes(start_time)), None)
        if pending is None:
            self.words.append(text)
            return []
        pending.words.append(text)
        return [self._delta(pending, len(pending.words) - 1)] if pending.item_id else []

    def _marker_back(self, marker_id: object) -> list[Event]:
        out: list[Event] = []
        while self.pending and self.pending[0].marker_id != marker_id:
            out += self._complete(self.pending.popleft())  # an earlier one (never, in order)
        if self.pending:
            out += self._complete(self.pending.popleft())
        return out

    def _complete(self, pending: _Pending) -> list[Event]:
        if not pending.item_id:
            return []
        seconds = pending.samples / protocol.SAMPLE_RATE
        # The usage before the transcript: routers read it from the event's first bytes
        # (router.dialects.turn_seconds) to count each key's audio.
        return [event("conversation.item.input_audio_transcription.completed",
                      item_id=pending.item_id, content_index=0,
                      usage={"type": "duration", "seconds": round(seconds, 3)},
                      transcript=" ".join(pending.words))]

    def _delta(self, pending: _Pending, index: int) -> Event:
        text = pending.words[index] if index == 0 else " " + pending.words[index]
        return event("conversation.item.input_audio_transcription.delta",
                     item_id=pending.item_id, content_index=0, delta=text)

    def _session(self) -> dict[str, Any]:
        if self.beta:
            beta_format = next(k for k, v in BETA_FORMATS.items() if v == self.audio_format)
            return {"object": "realtime.transcription_session",
                    "input_audio_format": beta_format,
                    "input_audio_transcription": self.transcription,
                    "turn_detection": self._turn_detection(),
                    "input_audio_noise_reduction": self.noise_reduction,
                    # No client_secret: OpenAI's is only in a session made over REST.
                    "include": self.include, "modalities": ["text"]}
        return {"type": "transcription", "object": "realtime.transcription_session",
                "audio": {"input": {"format": self._ga_format(),
                                    "transcription": self.transcription,
                                    "noise_reduction": self.noise_reduction,
                                    "turn_detection": self._turn_detection()}},
                "include": self.include}

    def _ga_format(self) -> dict[str, Any]:
        if self.audio_format == PCM:
            return {"type": PCM, "rate": protocol.SAMPLE_RATE}
        return {"type": self.audio_format}

    def _turn_detection(self) -> dict[str, Any] | None:
        return None if self.detector is None else self.detector.detection.described()


def _parse(text: str) -> dict[str, Any]:
    try:
        message = json.loads(text)
    except ValueError as exc:
        raise Refused("invalid_json", f"Invalid event: failed to parse JSON value: {exc}.") \
            from None
    if not isinstance(message, dict):
        raise Refused("invalid_event", "An event is a JSON object.")
    if not isinstance(message.get("type"), str):
        raise Refused("invalid_event", "The 'type' field is missing.", "type")
    return message


def _event_id(message: dict[str, Any]) -> str | None:
    value = message.get("event_id")
    return value if isinstance(value, str) else None


def _ga_fields(session: dict[str, Any]) -> dict[str, Any]:
    _known(session, "session", {"type", "audio", "include"})
    if session.get("type") != "transcription":
        raise Refused("invalid_value", "Invalid value: session.type must be 'transcription' on "
                      "a transcription session.", "session.type")
    audio = _object(session, "audio", "session")
    given = _object(audio, "input", "session.audio")
    _known(given, "session.audio.input",
           {"format", "transcription", "turn_detection", "noise_reduction"})
    out = _common(given, "session.audio.input", "transcription", "noise_reduction", session)
    if "format" in given:
        out["format"] = _format(given["format"])
    return out


def _beta_fields(session: dict[str, Any]) -> dict[str, Any]:
    _known(session, "session", {"input_audio_format", "input_audio_transcription",
                                "turn_detection", "input_audio_noise_reduction", "include",
                                "modalities", "client_secret"})
    out = _common(session, "session", "input_audio_transcription",
                  "input_audio_noise_reduction", session)
    if "input_audio_format" in session:
        audio_format = session["input_audio_format"]
        if audio_format not in BETA_FORMATS:
            raise Refused("invalid_value", f"Invalid value: {audio_format!r}. Supported values "
                          "are: 'pcm16', 'g711_ulaw' and 'g711_alaw'.",
                          "session.input_audio_format")
        out["format"] = BETA_FORMATS[audio_format]
    return out


def _common(given: dict[str, Any], where: str, transcription_key: str, noise_key: str,
            session: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "turn_detection" in given:
        out["turn_detection"] = _turn_detection(given, where)
    if given.get(transcription_key) is not None:
        transcription = _object(given, transcription_key, where)
        _known(transcription, f"{where}.{transcription_key}",
               {"model", "language", "prompt", "delay", "keywords", "languages"})
        out["transcription"] = {k: transcription.get(k) for k in ("model", "language", "prompt")}
    if noise_key in given:
        out["noise_reduction"] = given[noise_key]
    if "include" in session:
        include = session["include"]
        if include is not None and (not isinstance(include, list)
                                    or not all(isinstance(i, str) for i in include)):
            raise Refused("invalid_type", "Invalid type for 'session.include': expected a list "
                          "of strings.", "session.include")
        out["include"] = include
    return out


def _turn_detection(given: dict[str, Any], where: str) -> turns.Detection | None:
    if given["turn_detection"] is None:
        return None
    detection = _object(given, "turn_detection", where)
    try:
        return turns.read(detection, f"{where}.turn_detection")
    except turns.Refused as exc:
        code = "unknown_parameter" if str(exc).startswith("Unknown") else "invalid_value"
        raise Refused(code, str(exc), exc.param) from None


def _format(given: object) -> str:
    """A GA ``format``: its type, checked with its rate."""
    if not isinstance(given, dict):
        raise Refused("invalid_type", "Invalid type for 'session.audio.input.format': expected "
                      "an object.", "session.audio.input.format")
    kind = given.get("type")
    if kind not in FORMATS:
        raise Refused("invalid_value", f"Invalid value: {kind!r}. Supported values are: "
                      "'audio/pcm' (24 kHz 16-bit PCM), 'audio/pcmu' and 'audio/pcma'.",
                      "session.audio.input.format.type")
    rate = protocol.SAMPLE_RATE if kind == PCM else g711.RATE
    if given.get("rate", rate) != rate:
        raise Refused("invalid_value", f"Invalid value: {given.get('rate')!r}. {kind} has a "
                      f"rate of {rate}.", "session.audio.input.format.rate")
    return str(kind)


def _object(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = parent.get(key, {})
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Refused("invalid_type", f"Invalid type for '{where}.{key}': expected an object.",
                      f"{where}.{key}")
    return value


def _known(given: dict[str, Any], where: str, known: set[str]) -> None:
    for key in given:
        if key not in known:
            raise Refused("unknown_parameter", f"Unknown parameter: '{where}.{key}'.",
                          f"{where}.{key}")
