"""Why a stream was refused or ended, as the client is told: an ``Error`` and a close.

A pure mapping, so every reason has one tested message, ``code`` and close code.
"""

from __future__ import annotations

import dataclasses

from asrpool.common import protocol
from asrpool.common.protocol import CloseCode, ErrorCode


@dataclasses.dataclass(frozen=True)
class Refusal:
    code: ErrorCode
    message: str
    close_code: int

    def frame(self) -> bytes:
        return protocol.error(self.message, self.code)


def busy() -> Refusal:
    return Refusal(ErrorCode.BUSY, protocol.BUSY_MESSAGE, CloseCode.TRY_AGAIN)


def unknown_pool(pool: str) -> Refusal:
    return Refusal(ErrorCode.UNKNOWN_POOL, f"unknown pool {pool[:80]!r}", CloseCode.POLICY)


def key_limit(key_id: str, limit: int) -> Refusal:
    return Refusal(
        ErrorCode.KEY_LIMIT,
        f"API key {key_id!r} already has its {limit} concurrent streams",
        CloseCode.POLICY,
    )


def queue_full(limit: int) -> Refusal:
    return Refusal(
        ErrorCode.QUEUE_FULL,
        f"no free channels and the wait queue is full ({limit} waiting); try again later",
        CloseCode.TRY_AGAIN,
    )


def key_queue_full(key_id: str, limit: int) -> Refusal:
    return Refusal(
        ErrorCode.KEY_QUEUE_FULL,
        f"API key {key_id!r} already has {limit} streams waiting for a channel",
        CloseCode.TRY_AGAIN,
    )


def pod_throttled() -> Refusal:
    """The pod refused the router's link over its new streams per second: no pool
    demand (nothing is written to Redis), the client may try again in a second."""
    return Refusal(ErrorCode.TOO_MANY_STREAMS, "the pod is over its new streams per second; try "
                   "again in a second", CloseCode.TRY_AGAIN)


def client_left() -> Refusal:
    """Nobody to tell: the client left during its admission (for the metrics)."""
    return Refusal(ErrorCode.CLIENT_LEFT, "the client left during admission", CloseCode.NORMAL)


def bad_resume_token() -> Refusal:
    return Refusal(ErrorCode.BAD_RESUME_TOKEN, "unknown or expired resume token", CloseCode.POLICY)


def pod_gone() -> Refusal:
    return Refusal(
        ErrorCode.POD_LOST,
        "the pod serving this session is gone; start a new stream",
        CloseCode.INTERNAL,
    )


def pod_lost() -> Refusal:
    return Refusal(
        ErrorCode.POD_LOST,
        "the pod serving this stream failed; start a new stream",
        CloseCode.INTERNAL,
    )


def unavailable() -> Refusal:
    return Refusal(
        ErrorCode.UNAVAILABLE,
        "the router cannot reach its session registry; try again shortly",
        CloseCode.TRY_AGAIN,
    )


def too_large(size: int, limit: int) -> Refusal:
    return Refusal(
        ErrorCode.TOO_LARGE,
        f"message of {size} bytes exceeds the limit of {limit} bytes",
        CloseCode.TOO_LARGE,
    )
