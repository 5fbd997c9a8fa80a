"""What the engine says about one stream, and how it turns text tokens into words.

:class:`WordDecoder` follows Kyutai's moshi-server exactly: after
``asr_delay_in_tokens`` steps, a text token other than 0 and 3 extends the current
word; 0 or 3 closes it (``Word`` with the start time of the previous stop); 0 also
sets the stop time ``(step - delay) / 12.5`` and ends the word (``EndWord``).
Times are in the stream's own audio time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from asrpool.common import protocol

FRAME_RATE = protocol.FRAME_RATE
END_OF_PADDING = 0
PADDING = 3


@dataclasses.dataclass(frozen=True)
class Word:
    text: str
    start_time: float


@dataclasses.dataclass(frozen=True)
class EndWord:
    stop_time: float


@dataclasses.dataclass(frozen=True)
class Step:
    step_idx: int
    prs: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Marker:
    id: int


@dataclasses.dataclass(frozen=True)
class Restarted:
    """The stream's ``Init`` is done: its model row was reset here (answered ``Ready``)."""


Event = Word | EndWord | Step | Marker | Restarted


def to_message(event: Event, buffered_pcm: int = 0) -> dict[str, Any]:
    """The protocol message for an event (``buffered_pcm`` only matters for Step)."""
    if isinstance(event, Word):
        return {"type": "Word", "text": event.text, "start_time": event.start_time}
    if isinstance(event, EndWord):
        return {"type": "EndWord", "stop_time": event.stop_time}
    if isinstance(event, Step):
        return {"type": "Step", "step_idx": event.step_idx, "prs": list(event.prs),
                "buffered_pcm": buffered_pcm}
    if isinstance(event, Restarted):
        return {"type": "Ready"}
    return {"type": "Marker", "id": event.id}


@dataclasses.dataclass
class WordDecoder:
    """Per-stream word assembly and marker timing; pure Python, no tensors."""

    delay: int
    detokenize: Callable[[list[int]], str]
    step_idx: int = 0
    word_tokens: list[int] = dataclasses.field(default_factory=list)
    unended_word: bool = False
    last_stop_time: float = 0.0
    markers: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (due step, id)

    def reset(self, keep_markers: bool = False) -> None:
        """A fresh stream; pending markers are dropped, or kept as due as they were."""
        self.markers = [(due - self.step_idx, mid) for due, mid in self.markers
                        if keep_markers]
        self.step_idx = 0
        self.word_tokens.clear()
        self.unended_word = False
        self.last_stop_time = 0.0

    def add_marker(self, marker_id: int, frames_pending: int) -> None:
        """Due once the frames already queued and ``delay`` more steps have run."""
        self.markers.append((self.step_idx + frames_pending + self.delay, marker_id))

    def feed(self, text_token: int) -> list[Event]:
        self.step_idx += 1
        events = self._word_events(text_token) if self.step_idx >= self.delay else []
        if self.markers:  # most steps have none due, and most streams none waiting
            events += self._due_markers()
        return events

    def _word_events(self, token: int) -> list[Event]:
        if token == PADDING and not self.word_tokens:  # most steps: nothing to say
            return []
        events: list[Event] = []
        if token in (END_OF_PADDING, PADDING):
            if self.word_tokens:
                events.append(Word(self.detokenize(self.word_tokens), self.last_stop_time))
                self.word_tokens = []
                self.unended_word = True
        else:
            self.word_tokens.append(token)
        if token == END_OF_PADDING:
            stop_time = (self.step_idx - self.delay) / FRAME_RATE
            if self.unended_word:
                self.unended_word = False
                events.append(EndWord(stop_time))
            self.last_stop_time = stop_time
        return events

    def _due_markers(self) -> list[Event]:
        due = [marker_id for step, marker_id in self.markers if step <= self.step_idx]
        self.markers = [(step, mid) for step, mid in self.markers if step > self.step_idx]
        return [Marker(marker_id) for marker_id in due]
