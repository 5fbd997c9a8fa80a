"""Synthetic audio for engine and server tests: seeded, varied, 24 kHz float32."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np

from asrpool.bench import synthetic

FRAME_SIZE = 1920


def random_speechlike(seconds: float, seed: int) -> np.ndarray:
    """Noise shaped by a random syllable-rate envelope plus a wandering tone."""
    return synthetic.speechlike(seconds, seed)


def frames_of(pcm: np.ndarray) -> list[np.ndarray]:
    return [pcm[i:i + FRAME_SIZE] for i in range(0, len(pcm) - FRAME_SIZE + 1, FRAME_SIZE)]


def audio_until(stop: asyncio.Event) -> Iterator[dict[str, Any]]:
    """Kyutai-client messages: 80 ms noise frames until ``stop``, then a marker and silence."""
    second = (0.2 * np.random.default_rng(7).standard_normal(24_000)).astype(np.float32)
    silence = np.zeros(24_000, dtype=np.float32)
    while not stop.is_set():
        for start in range(0, 24_000, 1920):
            yield {"type": "Audio", "pcm": second[start:start + 1920]}
    yield {"type": "Audio", "pcm": silence}
    yield {"type": "Marker", "id": 0}
    for _ in range(3):
        yield {"type": "Audio", "pcm": silence}
