"""Synthetic audio for engine and server tests: seeded, varied, 24 kHz float32."""

from __future__ import annotations

import numpy as np

from asrpool.bench import isolation

FRAME_SIZE = 1920


def random_speechlike(seconds: float, seed: int) -> np.ndarray:
    """Noise shaped by a random syllable-rate envelope plus a wandering tone."""
    return isolation.speechlike(seconds, seed)


def frames_of(pcm: np.ndarray) -> list[np.ndarray]:
    return [pcm[i:i + FRAME_SIZE] for i in range(0, len(pcm) - FRAME_SIZE + 1, FRAME_SIZE)]
