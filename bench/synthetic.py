"""Speech-like audio for load: what the benchmarks send when no recording is given."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from asrpool.common import protocol


def speechlike(seconds: float, seed: int) -> NDArray[np.float32]:
    """Noise shaped by a random syllable-rate envelope plus a wandering tone (24 kHz),
    whole 80 ms frames of it."""
    rng = np.random.default_rng(seed)
    rate = protocol.SAMPLE_RATE
    n = int(seconds * rate) // protocol.FRAME_SIZE * protocol.FRAME_SIZE
    t = np.arange(n) / rate
    envelope = np.abs(np.sin(2 * np.pi * rng.uniform(2, 5) * t + rng.uniform(0, 6)))
    tone = np.sin(2 * np.pi * np.cumsum(rng.uniform(100, 400, n)) / rate)
    samples = 0.2 * envelope * (0.5 * rng.standard_normal(n) + tone)
    pcm: NDArray[np.float32] = samples.astype(np.float32)
    return pcm
