"""Each pool's router-to-pod token, derived from one seed.

The operator and the routers share a seed (the chart's Secret in the release namespace).
The operator writes each pool's token into a Secret in the pool's own namespace, for its
pods; a router computes the token of the pool it dials. A token is its pool's alone:
whoever reads a Secret in one namespace gets into no other namespace's pods, and no
router reads a Secret outside its own namespace.
"""

from __future__ import annotations

import hashlib
import hmac

_CONTEXT = b"asrpool pod token\x00"  # no other use of the seed derives the same bytes


def for_pool(seed: str, pool: str) -> str:
    """The token of ``pool`` (its registry name, NAMESPACE/NAME), 64 hex digits."""
    return hmac.new(seed.encode(), _CONTEXT + pool.encode(), hashlib.sha256).hexdigest()
