"""How a stream's connection ended: a small typed union, as the router's ``proxying.End``.

The websocket handler decides which one it is; :meth:`sessions.Sessions.finish` decides
what happens to the slot (kept for a resume only after ``Lost`` of a resumable stream).
"""

from __future__ import annotations

import dataclasses

from asrpool.common import protocol


@dataclasses.dataclass(frozen=True)
class Closed:
    """The client closed, or left without having asked to resume: the slot is freed."""


@dataclasses.dataclass(frozen=True)
class Lost:
    """The connection was lost (no close frame, or one without a code)."""


@dataclasses.dataclass(frozen=True)
class Replaced:
    """A resume took the stream over; the new connection owns it."""


# The pod ends the stream: Error{message, code} is sent, then a close (the router's
# refusals are the same type).
Failed = protocol.Refusal


Outcome = Closed | Lost | Replaced | Failed


def busy(message: str = protocol.BUSY_MESSAGE) -> Failed:
    return Failed(message, protocol.ErrorCode.BUSY, protocol.CloseCode.TRY_AGAIN)


def shutting_down(processed: int, received: int) -> Failed:
    """The drain's grace is over: how far the stream's audio was transcribed (samples
    the model has taken, of those received), so the client knows what to send again."""
    done, got = processed / protocol.SAMPLE_RATE, received / protocol.SAMPLE_RATE
    return Failed(
        f"server shutting down: {done:.2f} s of this stream's audio were transcribed "
        f"({got:.2f} s received); send the rest to a new stream", protocol.ErrorCode.DRAINING,
        protocol.CloseCode.RESTART,
        (("processed_seconds", round(done, 3)), ("received_seconds", round(got, 3))))
