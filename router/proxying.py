"""How a proxied stream ended (:data:`End`), and whether it then waits for a resume.

The relay (:mod:`asrpool.router.relaying`) says how; the caller decides what each side
is told and how the session is settled in Redis.
"""

from __future__ import annotations

import dataclasses

from asrpool.common import protocol


@dataclasses.dataclass(frozen=True)
class ClientLeft:
    code: int


@dataclasses.dataclass(frozen=True)
class PodClosed:
    code: int
    reason: str


@dataclasses.dataclass(frozen=True)
class PodLost:
    detail: str


@dataclasses.dataclass(frozen=True)
class PodShed:
    """The pod ended the stream for a reason of its own, not the client's (its drain's
    grace over, or shedding to keep real time): its ``Error`` frame, held back from the
    client while the stream moves (told if it cannot), and its close code."""

    error: bytes
    code: str
    close_code: int


@dataclasses.dataclass(frozen=True)
class TooSlow:
    """The client read nothing while its bytes stayed over the high-water mark for
    ``seconds``: the connection was aborted; the session is released."""

    seconds: float


End = ClientLeft | PodClosed | PodLost | PodShed | TooSlow
Movable = PodLost | PodShed  # the ends after which a stream moves (router.moving)

# Client close codes of a lost connection (1005 no status, 1006 no close frame): the
# pod keeps the slot for a resume only if the client asked for one. This router
# shutting down (1012) always leaves its streams resumable. The router then drops its
# pod connection without a close frame, which the pod reads as lost too.
LOST_CODES = frozenset({protocol.CloseCode.NO_STATUS, protocol.CloseCode.LOST})
SHUTDOWN_CODE = protocol.CloseCode.RESTART


def detaches(end: End, resumable: bool) -> bool:
    """Whether the session waits for a resume after ``end``."""
    if not isinstance(end, ClientLeft):
        return False
    return end.code == SHUTDOWN_CODE or (resumable and end.code in LOST_CODES)
