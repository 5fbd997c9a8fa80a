"""Offline transcription of a file through the same batched engine the server runs.

The stream runs in slot 0 of an engine with the server's batch size (a row's result
does not depend on the other rows, but float rounding can depend on the batch size),
fed exactly what Kyutai's file client would send, so its words equal the server's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from asrpool.server import events as ev
from asrpool.server.engine import FRAME_SIZE, BatchedEngine


class FrameBuffer:
    """Samples of one stream, handed out in whole 1920-sample frames."""

    def __init__(self) -> None:
        self._samples: NDArray[np.float32] = np.zeros(0, dtype=np.float32)

    def push(self, pcm: NDArray[np.float32]) -> None:
        self._samples = np.concatenate([self._samples, pcm.astype(np.float32, copy=False)])

    @property
    def full_frames(self) -> int:
        return len(self._samples) // FRAME_SIZE

    def pop_frame(self) -> NDArray[np.float32]:
        frame, self._samples = self._samples[:FRAME_SIZE], self._samples[FRAME_SIZE:]
        return frame


def run_messages(engine: BatchedEngine, messages: Iterable[dict[str, Any]],
                 slot: int = 0) -> list[ev.Event]:
    """Feed client messages to one slot and stop at the step where the last marker
    comes back: a streaming client sees nothing after it."""
    engine.reset_slot(slot)
    buffer, out, markers_sent = FrameBuffer(), [], 0
    for message in messages:
        if message["type"] == "Marker":
            engine.add_marker(slot, message["id"], buffer.full_frames)
            markers_sent += 1
            continue
        buffer.push(message["pcm"])
        while buffer.full_frames:
            out += engine.step({slot: buffer.pop_frame()}).events[slot]
            if markers_sent and _markers_in(out) == markers_sent:
                return out
    return out


def _markers_in(events: list[ev.Event]) -> int:
    return sum(isinstance(event, ev.Marker) for event in events)


def words_of(events: Iterable[ev.Event]) -> list[ev.Word | ev.EndWord]:
    return [e for e in events if isinstance(e, ev.Word | ev.EndWord)]
