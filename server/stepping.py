"""What every engine does around the model's forward: the seam a stand-in fills.

An :class:`Engine` owns ``batch_size`` stream slots. Each :meth:`Engine.step` takes at
most one 1920-sample frame per slot into its rows (the other rows carry zeros, or what
the caller says), runs the forward over the rows of the slots with a frame
(:meth:`Engine._forward`: the model's in ``engine.BatchedEngine``, a measured time in
``pacing.PacedEngine``), and turns each row's text token and extra heads' values into
that stream's events through its own ``events.WordDecoder`` (the delay, words, markers).
A slot joins or leaves through :meth:`Engine.reset_slots`, which resets those rows
alone. The engine thread (``engine_loop``) and the engine process (``enginechild``)
know engines by this class only.

An engine is not thread-safe: one loop owns it. This module imports no torch.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from asrpool.common import protocol
from asrpool.server import events as ev

if TYPE_CHECKING:
    from asrpool.server import pacing

FRAME_SIZE = protocol.FRAME_SIZE

# Every row's text token (B,), extra heads' values (B, heads) and audio codes (B, codebooks).
Forwarded = tuple[NDArray[np.int64], NDArray[np.float32], NDArray[np.int64]]


class EngineInputError(ValueError):
    """A frame or slot the engine cannot take; nothing was changed."""


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one batched step produced: events per slot, and the raw tokens of its rows
    (read by tests and benches only: made into dicts when asked for, never in a pod's
    step)."""

    events: dict[int, list[ev.Event]]
    slots: list[int] = dataclasses.field(default_factory=list)
    tokens: NDArray[np.int64] | None = None  # every row's text token
    codes: NDArray[np.int64] | None = None  # every row's audio codes

    @property
    def text_tokens(self) -> dict[int, int]:
        tokens = self.tokens
        return {} if tokens is None else {slot: int(tokens[slot]) for slot in self.slots}

    @property
    def audio_codes(self) -> dict[int, list[int]]:
        codes = self.codes
        return {} if codes is None else {slot: codes[slot].tolist() for slot in self.slots}


class Engine(abc.ABC):
    # What a paced stand-in stands in for (``pacing``); None where a model runs.
    pace: pacing.Pace | None = None

    def __init__(self, model_id: str, batch_size: int, delay: int,
                 detokenize: Callable[[list[int]], str], has_extra_heads: bool) -> None:
        if batch_size < 1:
            raise EngineInputError(f"batch size must be at least 1, got {batch_size}")
        self.model_id = model_id
        self.batch_size = batch_size
        self.delay = delay  # steps from a frame to its word (a stream's flush needs as many)
        self.has_extra_heads = has_extra_heads
        self._pcm = np.zeros((batch_size, 1, FRAME_SIZE), dtype=np.float32)
        self.decoders = [ev.WordDecoder(delay, detokenize) for _ in range(batch_size)]
        self.steps_run = 0

    @abc.abstractmethod
    def _forward(self, slots: list[int]) -> Forwarded:
        """The forward over the rows (``self._pcm``) of ``slots``; the others do not move."""

    @abc.abstractmethod
    def _reset_rows(self, rows: list[int]) -> None:
        """Start the forward's state of these rows afresh (their decoders are reset here)."""

    @abc.abstractmethod
    def state_nbytes(self) -> int:
        """Bytes of streaming state held for all slots (constant by design)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Let go of what the engine holds."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def reset_slot(self, slot: int, keep_markers: bool = False) -> None:
        """Start a fresh stream in ``slot``; every other slot is untouched. With
        ``keep_markers`` (a client's ``Init``), its pending markers stay due as many
        steps later as they were."""
        self.reset_slots([slot], keep_markers)

    def reset_slots(self, slots: Iterable[int], keep_markers: bool = False) -> None:
        """:meth:`reset_slot` for several slots in one reset of the forward's state."""
        rows = sorted(set(slots))
        for slot in rows:
            self._check_slot(slot)
        if not rows:
            return
        self._reset_rows(rows)
        for slot in rows:
            self.decoders[slot].reset(keep_markers)

    def add_marker(self, slot: int, marker_id: int, frames_pending: int) -> None:
        self._check_slot(slot)
        self.decoders[slot].add_marker(marker_id, frames_pending)

    def step(self, frames: Mapping[int, NDArray[np.float32]],
             masked_audio: NDArray[np.floating[Any]] | None = None,
             checked: bool = False) -> StepResult:
        """Run one batched step over the slots in ``frames`` (slot -> 1920 samples).

        ``masked_audio`` is what the rows of the other slots carry (zeros by default);
        it must not change any result, and the tests check that. ``checked``: the caller
        has checked every sample already (a pod's intake does, as each message comes),
        so only the frames' shapes are looked at here.
        """
        self._load_frames(frames, masked_audio, checked)
        if not frames:
            return StepResult({})
        slots = sorted(frames)
        text_tokens, prs, codes = self._forward(slots)
        self.steps_run += 1
        return self._decode(slots, text_tokens, prs, codes)

    def _load_frames(self, frames: Mapping[int, NDArray[np.float32]],
                     masked_audio: NDArray[np.floating[Any]] | None, checked: bool) -> None:
        check = check_shape if checked else check_frame
        for slot, frame in frames.items():
            self._check_slot(slot)
            check(frame)
        self._pcm[:] = 0.0 if masked_audio is None else masked_audio.reshape(self._pcm.shape)
        if frames:  # one copy of every row
            self._pcm[list(frames), 0] = np.stack(list(frames.values()))

    def _decode(self, slots: list[int], text_tokens: NDArray[np.int64], prs: NDArray[np.float32],
                codes: NDArray[np.int64]) -> StepResult:
        events: dict[int, list[ev.Event]] = {}
        # The rows as Python numbers in one call each, not an element at a time.
        tokens: list[int] = text_tokens[slots].tolist()
        probs: list[list[float]] | None = prs[slots].tolist() if self.has_extra_heads else None
        decoders = self.decoders
        for row, slot in enumerate(slots):
            decoder = decoders[slot]
            slot_events = decoder.feed(tokens[row])
            if probs is not None:
                slot_events.insert(0, ev.Step(decoder.step_idx, tuple(probs[row])))
            events[slot] = slot_events
        return StepResult(events, slots, text_tokens, codes)

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.batch_size:
            raise EngineInputError(f"slot {slot} is out of range (0..{self.batch_size - 1})")


def check_frame(frame: NDArray[np.float32]) -> None:
    check_shape(frame)
    problem = protocol.sample_problem(frame)
    if problem is not None:
        raise EngineInputError(f"a frame {problem}")


def check_shape(frame: NDArray[np.float32]) -> None:
    if not isinstance(frame, np.ndarray) or frame.shape != (FRAME_SIZE,):
        shape = getattr(frame, "shape", type(frame).__name__)
        raise EngineInputError(f"a frame must be {FRAME_SIZE} mono samples, got {shape}")
