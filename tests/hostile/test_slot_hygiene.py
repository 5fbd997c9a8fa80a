"""A slot is clean for its next user, whatever the previous one sent.

Finite but huge samples (3e38) overflow Mimi's convolutions into NaN, which lands in
the attention caches; a reset that only rewinds the caches' offsets leaves it there,
and masked attention (weight 0 times NaN) spreads it into the next stream of the slot.
"""

from __future__ import annotations

import warnings

import msgpack
import numpy as np
import pytest
import torch

from asrpool.common import protocol
from asrpool.server import engine, events, models
from tests.support import streams

STEPS = 40


Output = list[tuple[int, list[int], list[events.Event]]]


def _stream(eng: engine.BatchedEngine, slot: int, frames: list[np.ndarray]) -> Output:
    eng.reset_slot(slot)
    out: Output = []
    for frame in frames:
        result = eng.step({slot: frame})
        out.append((result.text_tokens[slot], result.audio_codes[slot], result.events[slot]))
    return out


def _poison(eng: engine.BatchedEngine, slot: int, steps: int = 20) -> None:
    """What a client's huge samples did to the slot before the engine refused them:
    NaN in the attention caches, further on than the next stream's first steps."""
    eng.reset_slot(slot)
    for _ in range(steps):
        eng._pcm[:] = 0.0
        eng._pcm[slot, 0] = 3e38
        eng._forward([slot])  # the model's forward alone: step() refuses such samples
    assert not all(torch.isfinite(c.cache).all() for c in eng._kv_caches)


def test_next_user_of_a_poisoned_slot_equals_a_fresh_engine(tiny: models.LoadedModel) -> None:
    frames = streams.frames_of(streams.random_speechlike(STEPS * 0.08, seed=21))[:STEPS]
    with engine.BatchedEngine(tiny, 2) as eng:
        fresh = _stream(eng, 1, frames)
    with engine.BatchedEngine(tiny, 2) as eng:
        _poison(eng, 1)
        after = _stream(eng, 1, frames)
    assert len({tuple(codes) for _, codes, _ in fresh}) > STEPS // 2  # not trivial
    assert after == fresh


def test_slots_reset_together_are_each_clean(tiny: models.LoadedModel) -> None:
    """The engine resets the new streams of one batch in one call: each of them, and
    only them, starts fresh (a third slot mid-stream goes on as it would have)."""
    frames = streams.frames_of(streams.random_speechlike(STEPS * 0.08, seed=23))[:STEPS]
    other = streams.frames_of(streams.random_speechlike(STEPS * 0.16, seed=24))[:2 * STEPS]
    with engine.BatchedEngine(tiny, 3) as eng:
        fresh = [(token, codes) for token, codes, _ in _stream(eng, 0, frames)]
        unbroken = [(token, codes) for token, codes, _ in _stream(eng, 2, other)]
    with engine.BatchedEngine(tiny, 3) as eng:
        _poison(eng, 0)
        _poison(eng, 1)
        eng.reset_slot(2)
        before = [eng.step({2: frame}) for frame in other[:STEPS]]
        eng.reset_slots([0, 1])
        pairs = zip(frames, other[STEPS:], strict=True)
        after = [eng.step({0: new, 1: new, 2: old}) for new, old in pairs]
    for slot in (0, 1):
        assert [(r.text_tokens[slot], r.audio_codes[slot]) for r in after] == fresh
    assert [(r.text_tokens[2], r.audio_codes[2]) for r in before + after] == unbroken


@pytest.mark.parametrize("sample", [3e38, -3e38, 1e6, protocol.MAX_AMPLITUDE * 1.01])
def test_samples_beyond_full_scale_are_refused(sample: float) -> None:
    pcm = [0.0] * 10 + [sample]
    with pytest.raises(protocol.ProtocolError) as info:
        protocol.decode_client(protocol.encode({"type": "Audio", "pcm": pcm}), 1 << 20)
    assert info.value.code == "bad_audio"
    assert "amplitude" in str(info.value)


@pytest.mark.parametrize("sample", [1e300, -1e300])
def test_doubles_beyond_float32_are_refused_by_their_amplitude(sample: float) -> None:
    frame = msgpack.packb({"type": "Audio", "pcm": [0.5, sample]})  # float64, as sent
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning from the cast either
        with pytest.raises(protocol.ProtocolError) as info:
            protocol.decode_client(frame, 1 << 20)
    assert info.value.code == "bad_audio"
    assert "amplitude 1e+300" in str(info.value)


def test_loud_but_sane_samples_pass() -> None:
    pcm = [protocol.MAX_AMPLITUDE, -protocol.MAX_AMPLITUDE, 1.0, -1.0]
    message = protocol.decode_client(protocol.encode({"type": "Audio", "pcm": pcm}), 1 << 20)
    assert message["type"] == "Audio"


def test_engine_refuses_huge_frames_and_the_slot_stays_clean(tiny: models.LoadedModel) -> None:
    frames = streams.frames_of(streams.random_speechlike(STEPS * 0.08, seed=22))[:STEPS]
    with engine.BatchedEngine(tiny, 2) as eng:
        fresh = _stream(eng, 0, frames)
        eng.reset_slot(0)
        with pytest.raises(engine.EngineInputError, match="amplitude"):
            eng.step({0: np.full(1920, 3e38, dtype=np.float32)})
        assert _stream(eng, 0, frames) == fresh
