"""The two protocols a client may stream in, as the router needs to tell them apart.

Kyutai's (``/api/asr-streaming``): msgpack in binary messages; a stream may resume
through any router and moves to another pod when its pod is lost. OpenAI's Realtime API
in transcription mode (``/v1/realtime?intent=transcription``): JSON events in text
messages; a session's turns (its buffer, its items, their words) live on its pod, so it
neither resumes nor moves, and a lost pod ends it with an ``error`` event. Both take the
same admission, slots, waiting room, limits and drain, and the relay passes their frames
as they are; what differs is the pod's path, how the pod's first message reads (taken
or refused), how the router's own refusals are worded, and how a session's audio is
counted for its key: Kyutai's ``Audio`` by its samples as the client sends it
(``retiming.audio_samples``), a realtime session's by the seconds each turn's
``...transcription.completed`` event says it transcribed (:func:`turn_seconds`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import msgpack

from asrpool.common import protocol, realtime_events
from asrpool.router import frames

# A pod's first message: whether it took the stream, and if not its code and message.
First = tuple[bool, str, str]
# A pod's event for a transcribed turn, as its first bytes, and the usage it writes
# before the transcript (server.realtime), within its first TURN_PEEK_BYTES.
TURN_COMPLETED = b'{"type":"conversation.item.input_audio_transcription.completed",'
TURN_SECONDS = re.compile(rb'"usage":\{"type":"duration","seconds":(\d+(?:\.\d+)?)\}')
TURN_PEEK_BYTES = 256


@dataclasses.dataclass(frozen=True)
class Dialect:
    name: str  # for logs: kyutai | realtime
    pod_path: str  # with its query
    opcode: int  # of the pod's messages, its first one included
    keeps_streams: bool  # resumable and movable
    pod_headers: tuple[tuple[str, str], ...] = ()  # the client's, passed on to the pod

    def first(self, payload: bytes) -> First:
        return _kyutai_first(payload) if self.opcode == frames.BINARY else _realtime_first(payload)

    def refusal(self, refusal: protocol.Refusal) -> bytes:
        """The router's own refusal as this protocol's message: an ``Error``, or an
        ``error`` event."""
        if self.opcode == frames.BINARY:
            return refusal.frame()
        return realtime_events.encode(realtime_events.error(
            str(refusal.code), refusal.message, kind=realtime_events.SERVER_ERROR))

    def told(self, refusal: protocol.Refusal) -> bytes:
        """The same as a whole websocket frame, for the relay to put in a flow."""
        return frames.frame(self.opcode, self.refusal(refusal))


KYUTAI = Dialect("kyutai", protocol.STREAMING_PATH, frames.BINARY, keeps_streams=True)


def realtime(headers: Any) -> Dialect:
    """OpenAI's, for a client whose request had ``headers`` (the beta header goes on)."""
    beta = headers.get(realtime_events.BETA_HEADER)
    return Dialect("realtime", f"{realtime_events.PATH}?intent={realtime_events.INTENT}",
                   frames.TEXT, keeps_streams=False,
                   pod_headers=((realtime_events.BETA_HEADER, beta),) if beta else ())


def _kyutai_first(payload: bytes) -> First:
    """``Ready``, or an ``Error``'s code and message."""
    try:
        body = msgpack.unpackb(payload, raw=False)
    except (ValueError, msgpack.UnpackException):  # every way msgpack says 'not msgpack'
        body = None
    if not isinstance(body, dict):
        return False, "", "the pod's first message is not a msgpack map"
    if body.get("type") == "Ready":
        return True, "", ""
    return False, str(body.get("code") or ""), str(body.get("message") or
                                                     f"pod answered {body.get('type')!r}")


def _realtime_first(payload: bytes) -> First:
    """``session.created`` (``transcription_session.created`` in beta), or an ``error``."""
    try:
        body = json.loads(payload)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return False, "", "the pod's first message is not a JSON object"
    if str(body.get("type", "")).endswith("session.created"):
        return True, "", ""
    error = body["error"] if isinstance(body.get("error"), dict) else {}
    return False, str(error.get("code") or ""), str(error.get("message") or
                                                      f"pod answered {body.get('type')!r}")


def turn_seconds(data: bytes, start: int) -> float:
    """The seconds of audio a pod's event whose (unmasked) payload starts at ``start``
    in ``data`` says its turn transcribed, or 0 for any other event or one whose usage is
    not in these bytes."""
    if not data.startswith(TURN_COMPLETED, start):
        return 0.0
    found = TURN_SECONDS.search(data, start, start + TURN_PEEK_BYTES)
    return float(found.group(1)) if found else 0.0
