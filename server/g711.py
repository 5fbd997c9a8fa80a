"""G.711 audio for OpenAI's Realtime clients (``audio/pcmu``, ``audio/pcma``; beta
``g711_ulaw``, ``g711_alaw``): 8 kHz telephone audio, decoded to 16-bit samples by the
standard's tables and brought to the model's 24 kHz by a streaming resampler, whose
state crosses appends so that where a client cuts its audio leaves no trace.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

RATE = 8000
FACTOR = 3  # 8 kHz to the model's 24 kHz
TAPS = 20 * FACTOR + 1  # of the low-pass: flat to about 3.4 kHz, the telephone band


def _mulaw_table() -> NDArray[np.int16]:
    """ITU-T G.711 mu-law: each byte's 16-bit sample."""
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent, mantissa = (code >> 4) & 0x07, code & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(code & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_table() -> NDArray[np.int16]:
    """ITU-T G.711 A-law: each byte's 16-bit sample."""
    code = np.arange(256, dtype=np.int32) ^ 0x55
    exponent, mantissa = (code >> 4) & 0x07, code & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8,
                         ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(code & 0x80, magnitude, -magnitude).astype(np.int16)


TABLES = {"audio/pcmu": _mulaw_table(), "audio/pcma": _alaw_table()}


def _low_pass() -> NDArray[np.float32]:
    """A windowed sinc at the 8 kHz audio's Nyquist frequency, with the gain that the
    zeros put between its samples take away."""
    n = np.arange(TAPS) - (TAPS - 1) / 2
    taps = np.sinc(n / FACTOR) * np.hanning(TAPS)
    scaled: NDArray[np.float32] = (taps * FACTOR / taps.sum()).astype(np.float32)
    return scaled


class Decoder:
    """One session's G.711 audio (``kind``: ``audio/pcmu`` or ``audio/pcma``) to float
    samples at 24 kHz, append after append."""

    def __init__(self, kind: str) -> None:
        self.table = TABLES[kind]
        self.taps = _low_pass()
        # the last upsampled samples
        self.history: NDArray[np.float32] = np.zeros(TAPS - 1, dtype=np.float32)

    def decode(self, data: bytes) -> NDArray[np.float32]:
        samples = self.table[np.frombuffer(data, dtype=np.uint8)].astype(np.float32) / 32768
        upsampled = np.zeros(len(samples) * FACTOR, dtype=np.float32)
        upsampled[::FACTOR] = samples
        joined = np.concatenate([self.history, upsampled])
        self.history = joined[len(joined) - (TAPS - 1):]
        out: NDArray[np.float32] = np.convolve(joined, self.taps, mode="valid").astype(
            np.float32)
        return out
