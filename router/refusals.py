"""Why a stream was refused or ended, as the client is told: an ``Error`` and a close.

A pure mapping, so every reason has one tested message, ``code`` and close code.
"""

from __future__ import annotations

import dataclasses

from asrpool.common import protocol


@dataclasses.dataclass(frozen=True)
class Refusal:
    code: str
    message: str
    close_code: int

    def frame(self) -> bytes:
        return protocol.error(self.message, self.code)


def busy() -> Refusal:
    return Refusal("busy", protocol.BUSY_MESSAGE, protocol.CloseCode.TRY_AGAIN)


def unknown_pool(pool: str) -> Refusal:
    return Refusal("unknown_pool", f"unknown pool {pool[:80]!r}", protocol.CloseCode.POLICY)


def key_limit(key_id: str, limit: int) -> Refusal:
    return Refusal(
        "key_limit",
        f"API key {key_id!r} already has its {limit} concurrent streams",
        protocol.CloseCode.POLICY,
    )


def queue_full(limit: int) -> Refusal:
    return Refusal(
        "queue_full",
        f"no free channels and the wait queue is full ({limit} waiting); try again later",
        protocol.CloseCode.TRY_AGAIN,
    )


def key_queue_full(key_id: str, limit: int) -> Refusal:
    return Refusal(
        "key_queue_full",
        f"API key {key_id!r} already has {limit} streams waiting for a channel",
        protocol.CloseCode.TRY_AGAIN,
    )


def pod_throttled() -> Refusal:
    """The pod refused the router's link over its new streams per second: no pool
    demand (nothing is written to Redis), the client may try again in a second."""
    return Refusal("too_many_streams", "the pod is over its new streams per second; try "
                   "again in a second", protocol.CloseCode.TRY_AGAIN)


def client_left() -> Refusal:
    """Nobody to tell: the client left during its admission (for the metrics)."""
    return Refusal("client_left", "the client left during admission", protocol.CloseCode.NORMAL)


def bad_resume_token() -> Refusal:
    return Refusal("bad_resume_token", "unknown or expired resume token", protocol.CloseCode.POLICY)


def pod_gone() -> Refusal:
    return Refusal(
        "pod_lost",
        "the pod serving this session is gone; start a new stream",
        protocol.CloseCode.INTERNAL,
    )


def pod_lost() -> Refusal:
    return Refusal(
        "pod_lost",
        "the pod serving this stream failed; start a new stream",
        protocol.CloseCode.INTERNAL,
    )


def unavailable() -> Refusal:
    return Refusal(
        "unavailable",
        "the router cannot reach its session registry; try again shortly",
        protocol.CloseCode.TRY_AGAIN,
    )


def too_large(size: int, limit: int) -> Refusal:
    return Refusal(
        "too_large",
        f"message of {size} bytes exceeds the limit of {limit} bytes",
        protocol.CloseCode.TOO_LARGE,
    )
