"""Constant memory: the rolling caches wrap; nothing grows with stream length."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from moshi.models.lm import LMGen

from asrpool.server import engine, models


def test_state_bytes_are_the_same_after_100_and_2000_steps() -> None:
    """Context 8: 2,000 steps wrap the rolling cache 250 times (10,000 steps took 100 s
    of a quiet CI machine and past the 300 s test timeout of a busy one)."""
    model = models.load_model("tiny", context=8)
    rng = np.random.default_rng(0)
    frames = [(0.1 * rng.standard_normal(1920)).astype(np.float32) for _ in range(16)]
    with engine.BatchedEngine(model, 2) as eng:
        eng.reset_slot(0)
        eng.reset_slot(1)
        sizes = {}
        for step in range(1, 2_001):
            eng.step({0: frames[step % 16], 1: frames[(step * 7) % 16]} if step % 3 else
                     {0: frames[step % 16]})
            if step in (100, 2_000):
                sizes[step] = eng.state_nbytes()
    assert sizes[100] > 0
    assert sizes[100] == sizes[2_000]


def test_an_engine_that_runs_out_of_memory_opening_leaves_the_model_free(
    tiny: models.LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capacity bench's out-of-memory trial must not poison the next trial."""
    def out_of_memory(self: LMGen, batch_size: int) -> None:
        raise torch.cuda.OutOfMemoryError("pretend the KV caches do not fit")

    with monkeypatch.context() as patch:
        patch.setattr(LMGen, "streaming", out_of_memory)
        with pytest.raises(torch.cuda.OutOfMemoryError):
            engine.BatchedEngine(tiny, 2)
    assert not tiny.mimi.is_streaming and not tiny.lm.is_streaming
    with engine.BatchedEngine(tiny, 2) as eng:
        eng.reset_slot(0)
        assert eng.step({0: np.zeros(1920, dtype=np.float32)}).text_tokens


def test_mimi_decoder_keeps_no_streaming_state_and_no_output_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Speech-to-text never decodes audio: an engine leaves Mimi's decoder side out of
    streaming, holds less per slot, and steps to the same tokens, heads and codes as an
    engine whose Mimi holds that state (the same model, the same frames)."""
    model = models.load_model("tiny")
    rng = np.random.default_rng(3)
    frames = [(0.1 * rng.standard_normal(1920)).astype(np.float32) for _ in range(24)]

    def run() -> tuple[list[tuple[dict[int, int], dict[int, list[int]]]], int, list[str]]:
        with engine.BatchedEngine(model, 2) as eng:
            eng.reset_slots([0, 1])
            out = []
            for i, frame in enumerate(frames):
                result = eng.step({0: frame, 1: frames[-1 - i]} if i % 4 else {0: frame})
                out.append((result.text_tokens, result.audio_codes))
            streaming = [name for name, part in model.mimi.named_modules()
                         if name.startswith(("decoder", "upsample"))
                         and getattr(part, "is_streaming", False)]
            return out, eng.state_nbytes(), streaming

    with monkeypatch.context() as patch:
        patch.setattr(engine, "encoder_only", lambda mimi: None)
        with_decoder, bytes_with, streaming = run()
    assert streaming  # the comparison's engine holds the decoder's state
    without_decoder, bytes_without, streaming = run()
    assert streaming == []
    assert bytes_without < bytes_with
    assert without_decoder == with_decoder
