"""Constant memory: the rolling caches wrap; nothing grows with stream length."""

from __future__ import annotations

import numpy as np

from asrpool.server import engine, models


def test_state_bytes_are_the_same_after_100_and_10000_steps() -> None:
    model = models.load_model("tiny", context=8)
    rng = np.random.default_rng(0)
    frames = [(0.1 * rng.standard_normal(1920)).astype(np.float32) for _ in range(16)]
    with engine.BatchedEngine(model, 2) as eng:
        eng.reset_slot(0)
        eng.reset_slot(1)
        sizes = {}
        for step in range(1, 10_001):
            eng.step({0: frames[step % 16], 1: frames[(step * 7) % 16]} if step % 3 else
                     {0: frames[step % 16]})
            if step in (100, 10_000):
                sizes[step] = eng.state_nbytes()
    assert sizes[100] > 0
    assert sizes[100] == sizes[10_000]
