"""New streams per second per client address and per API key, checked before any
admission or upgrade work: a client that opens and closes streams as fast as it can
gets HTTP 429 (with ``Retry-After``) and costs neither Redis nor a pod.

A refusal here is no demand for the pool: nothing is written to Redis, so
``asrpool:{POOL}:refused`` (what the operator scales on) does not count it.
The limits are the router's, not a worker's: each of its ``--workers`` processes keeps
its own buckets and enforces its share (``1/workers`` of the rate and of the burst; the
kernel spreads a client's connections over the workers' sockets). Router replicas each
enforce the whole limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from asrpool.common import rates
from asrpool.router import forwarding


class NewStreams:
    """The router's gate (``limits.StreamGate``, asked from the request head) and its
    per-key check (asked once the key is known); ``on_refused`` counts each refusal."""

    def __init__(self, rate: float, burst: float, on_refused: Callable[[], None] = lambda: None,
                 clock: rates.Clock = time.monotonic,
                 proxies: forwarding.TrustedProxies | None = None, share: float = 1.0) -> None:
        """``rate`` 0: no limit. Behind ``proxies`` the client is the one they name. This
        process enforces ``share`` of ``rate`` and ``burst`` (a burst of one at least);
        a refusal names the whole rate."""
        self.proxies = proxies or forwarding.TrustedProxies("")
        self.rate = rate
        self._on_refused = on_refused
        mine = (rate * share, max(1.0, burst * share))
        self._addresses = rates.KeyedBuckets(*mine, clock) if rate else None
        self._keys = rates.KeyedBuckets(*mine, clock) if rate else None

    def new_stream(self, address: str, headers: Sequence[tuple[bytes, bytes]] = ()
                   ) -> rates.Throttled | None:
        """Before authentication: a flood of bad keys is throttled too."""
        if self._addresses is None:
            return None
        client = self.proxies.client(address, headers)
        return self._take(self._addresses, client, f"from {client}")

    def of_key(self, key_id: str) -> rates.Throttled | None:
        return self._take(self._keys, key_id, f"of API key {key_id!r}") if key_id else None

    def _take(self, buckets: rates.KeyedBuckets | None, key: str,
              who: str) -> rates.Throttled | None:
        if buckets is None or buckets.take(key):
            return None
        self._on_refused()
        return rates.too_many_streams(self.rate, who, buckets.seconds_until(key))
