"""Messages per second per connection: one client cannot keep the event loop from its
neighbours' streams with a flood of tiny frames, markers or text frames.

A token bucket (``asrpool.common.rates``): ``rate`` tokens a second, at most ``burst``
saved. A message costs one token less the share of a model frame (1920 samples) it
carries, so audio at any pace in frames of 1920 samples or more (Kyutai's clients, a
file sent as fast as the pod takes it) costs nothing, real-time audio in 10 ms chunks
costs 87.5 tokens a second (under the default 250), and what costs the loop without
feeding the model (markers, text frames, a few samples per message) is what the budget
counts.
"""

from __future__ import annotations

import time

from asrpool.common import protocol, rates

# OggOpus messages carry bytes, not samples: at 24 kbit/s one byte is 8 samples.
OPUS_SAMPLES_PER_BYTE = 8


class MessageBudget:
    def __init__(self, rate: float, burst: float,
                 clock: rates.Clock = time.monotonic) -> None:
        self.bucket = rates.TokenBucket(rate, burst, clock)

    def spend(self, samples: int) -> bool:
        """Take the cost of a message carrying ``samples``; False once over budget."""
        return self.bucket.take(max(0.0, 1.0 - samples / protocol.FRAME_SIZE))


def samples_of(message: protocol.ClientMessage) -> int:
    """The audio a message carries, in samples (OggOpus estimated from its bytes)."""
    if message["type"] == "Audio":
        return len(message["pcm"])
    if message["type"] == "OggOpus":
        return len(message["data"]) * OPUS_SAMPLES_PER_BYTE
    return 0
