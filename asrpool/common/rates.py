"""Token buckets: how often something may happen, with a burst that may be saved up.

One policy for every rate in pods and routers: messages per connection
(``asrpool.server.budgets``), new streams per pod process and new streams per client
address or API key on a router (:class:`KeyedBuckets`). A bucket fills at ``rate``
tokens a second up to ``burst``; an action that costs more than the bucket holds is
refused and takes nothing, so a refused client that waits is served again.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable, Hashable

from asrpool.common import protocol

Clock = Callable[[], float]
TOO_MANY_STREAMS = protocol.ErrorCode.TOO_MANY_STREAMS


class TokenBucket:
    def __init__(self, rate: float, burst: float, clock: Clock = time.monotonic) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError(f"a token bucket needs a positive rate and burst, got {rate}, {burst}")
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = burst
        self.at = clock()

    def take(self, cost: float = 1.0) -> bool:
        """Spend ``cost`` tokens if the bucket holds them; False (nothing spent) if not."""
        self._fill()
        if self.tokens < cost:
            return False
        self.tokens -= cost
        return True

    def seconds_until(self, cost: float = 1.0) -> float:
        """How long until ``cost`` tokens are there (0 if they are now)."""
        self._fill()
        return max(0.0, (cost - self.tokens) / self.rate)

    def full(self) -> bool:
        self._fill()
        return self.tokens >= self.burst

    def _fill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now


class KeyedBuckets:
    """One :class:`TokenBucket` per key (a client address, an API key id).

    Memory is bounded: a bucket untouched for ``burst / rate`` seconds is full again and
    forgotten (forgetting it changes nothing), and past ``max_keys`` the least recently
    used bucket is dropped (which only forgives its key)."""

    def __init__(self, rate: float, burst: float, clock: Clock = time.monotonic,
                 max_keys: int = 65536) -> None:
        TokenBucket(rate, burst, clock)  # the same checks, once
        self.rate, self.burst, self.clock, self.max_keys = rate, burst, clock, max_keys
        self._buckets: collections.OrderedDict[Hashable, TokenBucket] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: Hashable, cost: float = 1.0) -> bool:
        return self._bucket(key).take(cost)

    def seconds_until(self, key: Hashable, cost: float = 1.0) -> float:
        return self._bucket(key).seconds_until(cost)

    def _bucket(self, key: Hashable) -> TokenBucket:
        self._forget_full()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, self.clock)
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(key)
        return bucket

    def _forget_full(self) -> None:
        """Drop the least recently used buckets that have refilled (oldest first)."""
        idle = self.burst / self.rate
        now = self.clock()
        while self._buckets:
            oldest = next(iter(self._buckets.values()))
            if now - oldest.at < idle:
                return
            self._buckets.popitem(last=False)


@dataclasses.dataclass(frozen=True)
class Throttled:
    """A new stream refused over a rate: HTTP 429 before the upgrade, with Retry-After."""

    message: str
    wait_seconds: float
    code: protocol.ErrorCode = TOO_MANY_STREAMS
    status: int = 429
    # Held back before it is sent (``limits.THROTTLED_HOLD_S``), so that a client that
    # retries at once cannot spin; not for a trusted caller (a router with the pod token)
    # that tells its own client at once and retries nothing.
    held: bool = True

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.wait_seconds)))}


def too_many_streams(rate: float, per: str, wait_seconds: float) -> Throttled:
    """``per``: whose rate it is ("on this pod", "from 10.0.0.7", "of API key 'k'")."""
    return Throttled(f"{TOO_MANY_STREAMS}: over {rate:g} new streams per second {per}; "
                     f"try again in {wait_seconds:.2f} s", wait_seconds)
