"""The cause of the word differences, checked: asrpool's own engine, in process, run on
the catalogue's messages with its first frame padded both ways.

moshi-server zero-pads a stream's first frame in Mimi's downsampling convolution,
Python moshi replicate-pads it, and the convolution comes after Mimi's encoder and
transformer, whose output is not zero even for silence: so every stream's first codes
differ, and a random LM answers other words from there on. If the engine padded with
zeros gives moshi-server's words and padded as asrpool pads gives the pod's, the first
frame's padding is the whole difference.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from asrpool.server import engine, models, transcribing
from asrpool.server import events as ev
from asrpool_harness.bench import padding, parity_cases, parity_weights

CASES = {"file client": parity_cases.file_client_messages,
         "speech first": parity_cases.speech_first_messages}


class _ZeroPadded:
    """An engine whose streams start as moshi-server's do (zeros before the first frame)."""

    def __init__(self, eng: engine.BatchedEngine) -> None:
        self.eng = eng

    def reset_slot(self, slot: int) -> None:
        self.eng.reset_slot(slot)
        padding.pad_like_moshi_server(self.eng.model.mimi, slot)

    def add_marker(self, slot: int, marker_id: int, frames_pending: int) -> None:
        self.eng.add_marker(slot, marker_id, frames_pending)

    def step(self, frames: dict[int, NDArray[np.float32]]) -> engine.StepResult:
        return self.eng.step(frames)


def words_of(eng: engine.BatchedEngine | _ZeroPadded,
             messages: Iterable[dict[str, Any]]) -> list[list[Any]]:
    events = transcribing.run_messages(cast(engine.BatchedEngine, eng), messages)
    return [["Word", e.text, e.start_time] if isinstance(e, ev.Word) else ["EndWord", e.stop_time]
            for e in transcribing.words_of(events)]


def engine_words(shared: parity_weights.SharedCheckpoint, batch_size: int
                 ) -> dict[str, dict[str, list[list[Any]]]]:
    """Each case's words through the engine, padded as asrpool pads (``replicate``) and
    as moshi-server does (``zeros``), at the servers' batch size."""
    model = models.load_model(str(shared.asrpool))
    found: dict[str, dict[str, list[list[Any]]]] = {}
    with engine.BatchedEngine(model, batch_size) as eng:
        for name, messages in CASES.items():
            found[name] = {"replicate": words_of(eng, messages()),
                           "zeros": words_of(_ZeroPadded(eng), messages())}
    return found


def check(found: dict[str, dict[str, list[list[Any]]]],
          answers: dict[str, dict[str, dict[str, Any]]], moshi_server: str, pod: str
          ) -> dict[str, dict[str, bool]]:
    """Whether the zero-padded engine says moshi-server's words and the other the pod's."""
    return {name: {"zeros_equal_moshi_server":
                   words["zeros"] == answers[name][moshi_server].get("words"),
                   "replicate_equals_pod": words["replicate"] == answers[name][pod].get("words")}
            for name, words in found.items()}
