"""Why a stream was refused or ended, as the client is told: an ``Error`` and a close.

A pure mapping, so every reason has one tested message, ``code`` and close code.
"""

from __future__ import annotations

from asrpool.common import protocol
from asrpool.common.protocol import CloseCode, ErrorCode

Refusal = protocol.Refusal  # the pod's outcomes.Failed is the same type


def busy() -> Refusal:
    return Refusal(protocol.BUSY_MESSAGE, ErrorCode.BUSY, CloseCode.TRY_AGAIN)


def unknown_pool(pool: str) -> Refusal:
    return Refusal(f"unknown pool {pool[:80]!r}", ErrorCode.UNKNOWN_POOL, CloseCode.POLICY)


def key_limit(key_id: str, limit: int) -> Refusal:
    return Refusal(
        f"API key {key_id!r} already has its {limit} concurrent streams",
        ErrorCode.KEY_LIMIT,
        CloseCode.POLICY,
    )


def queue_full(limit: int) -> Refusal:
    return Refusal(
        f"no free channels and the wait queue is full ({limit} waiting); try again later",
        ErrorCode.QUEUE_FULL,
        CloseCode.TRY_AGAIN,
    )


def key_queue_full(key_id: str, limit: int) -> Refusal:
    return Refusal(
        f"API key {key_id!r} already has {limit} streams waiting for a channel",
        ErrorCode.KEY_QUEUE_FULL,
        CloseCode.TRY_AGAIN,
    )


def pod_throttled() -> Refusal:
    """The pod refused the router's link over its new streams per second: no pool
    demand (nothing is written to Redis), the client may try again in a second."""
    return Refusal("the pod is over its new streams per second; try "
                   "again in a second", ErrorCode.TOO_MANY_STREAMS, CloseCode.TRY_AGAIN)


def client_left() -> Refusal:
    """Nobody to tell: the client left during its admission (for the metrics)."""
    return Refusal("the client left during admission", ErrorCode.CLIENT_LEFT, CloseCode.NORMAL)


def bad_resume_token() -> Refusal:
    return Refusal("unknown or expired resume token", ErrorCode.BAD_RESUME_TOKEN, CloseCode.POLICY)


def old_resume_token() -> Refusal:
    """A token of a router from before tokens named their pool (router.tokens): refused
    once, on upgrade, saying why, under the code of any other unusable token."""
    return Refusal("resume token from before a router upgrade (it names no pool); start a "
                   "new stream", ErrorCode.BAD_RESUME_TOKEN, CloseCode.POLICY)


def pod_gone() -> Refusal:
    return Refusal(
        "the pod serving this session is gone; start a new stream",
        ErrorCode.POD_LOST,
        CloseCode.INTERNAL,
    )


def pod_lost() -> Refusal:
    return Refusal(
        "the pod serving this stream failed; start a new stream",
        ErrorCode.POD_LOST,
        CloseCode.INTERNAL,
    )


def unavailable() -> Refusal:
    return Refusal(
        "the router cannot reach its session registry; try again shortly",
        ErrorCode.UNAVAILABLE,
        CloseCode.TRY_AGAIN,
    )


def too_large(size: int, limit: int) -> Refusal:
    return Refusal(
        f"message of {size} bytes exceeds the limit of {limit} bytes",
        ErrorCode.TOO_LARGE,
        CloseCode.TOO_LARGE,
    )


def router_draining() -> Refusal:
    """A new stream (or a resume) reaching a router that is shutting down: try again,
    another router takes it (this one's readiness already says 503)."""
    return Refusal("this router is shutting down; connect again", ErrorCode.DRAINING,
                   CloseCode.TRY_AGAIN)


def router_shut_down() -> Refusal:
    """The router's drain grace is over: the stream is held on its pod, for a resume
    through another router within the resume grace."""
    return Refusal("router shutting down: resume this stream with its resume token (on "
                   "another router) or start a new one", ErrorCode.DRAINING,
                   CloseCode.RESTART)
