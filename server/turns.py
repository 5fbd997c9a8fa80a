"""Turns from the model's own voice activity: OpenAI's ``server_vad`` and
``semantic_vad`` on Kyutai's pause prediction.

Kyutai's STT models (those with extra heads) say at every step how likely the speaker
is to be pausing; unmute reads head 2 of a ``Step``'s ``prs`` as that probability and
takes a turn as over above 0.6. Here the probability of speech is one minus that, and:

- speech starts at the first step whose probability of speech is over ``threshold``;
- it stops once that probability has stayed at or under ``threshold`` for
  ``silence_duration_ms``; ``audio_end_ms`` is that moment, as OpenAI's is;
- ``audio_start_ms`` reaches back ``prefix_padding_ms`` before the start (not before
  the end of the previous turn).

``semantic_vad`` is the same detector, since the head is itself semantic (it predicts
the end of a thought, not of a sound): its ``eagerness`` chooses how long a pause must
last (:data:`EAGERNESS`). The steps of silence the pod inserts itself (a commit's
flush) are not the client's audio and are skipped (:meth:`Detector.inserted`).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from asrpool.common import protocol

PAUSE_HEAD = 2  # the extra head unmute reads as "the speaker is pausing"
FRAME_MS = protocol.FRAME_SIZE * 1000 // protocol.SAMPLE_RATE  # 80
SERVER_VAD, SEMANTIC_VAD = "server_vad", "semantic_vad"
# semantic_vad: (threshold, silence_duration_ms) by eagerness; auto is medium, as OpenAI's.
EAGERNESS = {"high": (0.5, 0), "medium": (0.5, 2 * FRAME_MS), "auto": (0.5, 2 * FRAME_MS),
             "low": (0.5, 8 * FRAME_MS)}
SERVER_VAD_DEFAULTS: dict[str, float] = {"threshold": 0.5, "prefix_padding_ms": 300,
                                         "silence_duration_ms": 500}
_RESPONSE_FIELDS = ("create_response", "interrupt_response")  # accepted, moot: no responses


class Refused(ValueError):
    """A ``turn_detection`` that cannot be served; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclasses.dataclass(frozen=True)
class Detection:
    """A session's ``turn_detection``, read and checked."""

    kind: str
    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int
    eagerness: str = "auto"

    def described(self) -> dict[str, Any]:
        """As the session object shows it."""
        if self.kind == SEMANTIC_VAD:
            return {"type": SEMANTIC_VAD, "eagerness": self.eagerness,
                    "create_response": False, "interrupt_response": False}
        return {"type": SERVER_VAD, "threshold": self.threshold,
                "prefix_padding_ms": self.prefix_padding_ms,
                "silence_duration_ms": self.silence_duration_ms, "idle_timeout_ms": None,
                "create_response": False, "interrupt_response": False}


def read(given: dict[str, Any], where: str) -> Detection:
    """``turn_detection`` as a client gave it; raises :class:`Refused`."""
    kind = given.get("type", SERVER_VAD)
    if kind == SEMANTIC_VAD:
        _known(given, where, {"type", "eagerness", *_RESPONSE_FIELDS})
        eagerness = given.get("eagerness", "auto")
        if eagerness not in EAGERNESS:
            raise Refused(f"Invalid value: {eagerness!r}. Supported values are: 'low', "
                          "'medium', 'high' and 'auto'.", f"{where}.eagerness")
        least, pause_ms = EAGERNESS[eagerness]
        return Detection(SEMANTIC_VAD, least, 0, pause_ms, eagerness)
    if kind != SERVER_VAD:
        raise Refused(f"Invalid value: {kind!r}. Supported values are: 'server_vad' and "
                      "'semantic_vad'.", f"{where}.type")
    _known(given, where, {"type", *SERVER_VAD_DEFAULTS, "idle_timeout_ms", *_RESPONSE_FIELDS})
    values = {**SERVER_VAD_DEFAULTS, **{k: v for k, v in given.items()
                                        if k in SERVER_VAD_DEFAULTS and v is not None}}
    threshold = _number(values["threshold"], f"{where}.threshold", 0.0, 1.0)
    prefix = _number(values["prefix_padding_ms"], f"{where}.prefix_padding_ms", 0, 10_000)
    silence = _number(values["silence_duration_ms"], f"{where}.silence_duration_ms", 0, 10_000)
    return Detection(SERVER_VAD, float(threshold), int(prefix), int(silence))


def _number(value: object, param: str, least: float, most: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Refused(f"Invalid type for '{param}': expected a number.", param)
    if not least <= value <= most:
        raise Refused(f"Invalid value for '{param}': {value} is not within {least} and "
                      f"{most}.", param)
    return float(value)


def _known(given: dict[str, Any], where: str, known: set[str]) -> None:
    for key in given:
        if key not in known:
            raise Refused(f"Unknown parameter: '{where}.{key}'.", f"{where}.{key}")


@dataclasses.dataclass(frozen=True)
class Started:
    audio_start_ms: int


@dataclasses.dataclass(frozen=True)
class Stopped:
    audio_end_ms: int


Change = Started | Stopped


class Detector:
    """Speech starting and stopping, one step of the stream at a time."""

    def __init__(self, detection: Detection) -> None:
        self.detection = detection
        self.speaking = False
        self.quiet_since: int | None = None  # ms of the client's audio; None: not quiet
        self.turn_ended_ms = 0  # a turn's padding reaches back no further
        # The pod's own silence still ahead or under way: (first step, steps), in order;
        # the steps of those passed already.
        self.inserts: collections.deque[tuple[int, int]] = collections.deque()
        self.inserted_before = 0

    def inserted(self, first_step: int, steps: int) -> None:
        """The pod inserts ``steps`` frames of its own silence from stream step
        ``first_step`` on: they are no audio of the client's."""
        if steps > 0:
            self.inserts.append((first_step, steps))

    def step(self, step_idx: int, prs: list[float]) -> Change | None:
        """One ``Step`` of the stream: a change of speech, if it brings one."""
        ms = self._client_ms(step_idx)
        if ms is None or len(prs) <= PAUSE_HEAD:
            return None
        speech = 1.0 - float(prs[PAUSE_HEAD])
        if not self.speaking:
            if speech <= self.detection.threshold:
                return None
            self.speaking, self.quiet_since = True, None
            start = max(self.turn_ended_ms, ms - self.detection.prefix_padding_ms)
            return Started(start)
        if speech > self.detection.threshold:
            self.quiet_since = None
            return None
        if self.quiet_since is None:
            self.quiet_since = ms
        if ms + FRAME_MS - self.quiet_since < self.detection.silence_duration_ms:
            return None
        self.speaking, self.turn_ended_ms = False, ms + FRAME_MS
        return Stopped(ms + FRAME_MS)

    def _client_ms(self, step_idx: int) -> int | None:
        """The client's audio time at the start of stream step ``step_idx``; None for a
        step of inserted silence."""
        while self.inserts and sum(self.inserts[0]) <= step_idx:  # passed: counted
            self.inserted_before += self.inserts.popleft()[1]
        if self.inserts and self.inserts[0][0] <= step_idx:
            return None
        return (step_idx - self.inserted_before) * FRAME_MS
