"""Secrets derived from one seed, so that no process keeps a table of them.

The pod token seed: the operator and the routers share it (the chart's Secret in the
release namespace). The operator writes each pool's token into a Secret in the pool's
own namespace, for its pods; a router computes the token of the pool it dials. A token
is its pool's alone: whoever reads a Secret in one namespace gets into no other
namespace's pods, and no router reads a Secret outside its own namespace.

The Redis password seed: the operator's alone. It derives the password of each pool
namespace's Redis user (asrpool.common.redis_acl), which it sets in Redis and writes
into that namespace for its pods.
"""

from __future__ import annotations

import hashlib
import hmac


def derive(seed: str, purpose: str, subject: str) -> str:
    """64 hex digits, one value per (purpose, subject): no purpose derives another's."""
    message = f"asrpool {purpose}\x00{subject}".encode()
    return hmac.new(seed.encode(), message, hashlib.sha256).hexdigest()


def pod_token(seed: str, pool: str) -> str:
    """The token of ``pool`` (its registry name, NAMESPACE/NAME)."""
    return derive(seed, "pod token", pool)


def redis_password(seed: str, namespace: str) -> str:
    """The password of the Redis user of the pools of ``namespace``."""
    return derive(seed, "redis password", namespace)
