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


# A message the client got wrong: the stream ends after the results of its earlier audio.
CLIENT_FAULTS = frozenset({
    protocol.ErrorCode.MALFORMED, protocol.ErrorCode.BAD_MESSAGE, protocol.ErrorCode.UNKNOWN_TYPE,
    protocol.ErrorCode.BAD_AUDIO, protocol.ErrorCode.MIXED_AUDIO, protocol.ErrorCode.TOO_LARGE,
    protocol.ErrorCode.TOO_MANY_MESSAGES, protocol.ErrorCode.TOO_MANY_MARKERS})


def client_fault(exc: protocol.ProtocolError) -> Failed:
    too_large = exc.code == protocol.ErrorCode.TOO_LARGE
    return Failed(str(exc), exc.code, protocol.CloseCode.TOO_LARGE if too_large
                  else protocol.CloseCode.POLICY)


def refused_message(exc: protocol.ProtocolError, data: bytes) -> Failed:
    """A client message the pod refuses: the client's fault, or the refusal of a client
    message that a router refused in its place (over the size limit): not a type a
    client sends, and taken on any link, as a pod without a pod token has routers in
    front of it too (a client that forges one ends its own stream as the message it
    stands for would)."""
    if exc.code == protocol.ErrorCode.UNKNOWN_TYPE:
        refusal = protocol.decode_router_refusal(data)
        if refusal is not None:
            return refusal
    return client_fault(exc)


def over_budget(rate: float) -> Failed:
    return Failed(
        f"over {rate:g} messages per second (audio in frames of {protocol.FRAME_SIZE} "
        "samples or more is not counted): send fewer, larger messages",
        protocol.ErrorCode.TOO_MANY_MESSAGES)


def too_slow(seconds: float) -> Failed:
    """Aborted by the send deadline: not a lost client that may come back, a stuck one."""
    return Failed(f"the client read none of its results for {seconds:g} s",
                  protocol.ErrorCode.TOO_SLOW, protocol.CloseCode.POLICY)


def idle(seconds: float) -> Failed:
    return Failed(f"no message for {seconds:g} s", protocol.ErrorCode.IDLE_TIMEOUT,
                  protocol.CloseCode.NORMAL)


def disconnected(code: int) -> Closed | Lost:
    """A client's close with a code is its end; a vanished one (1005, 1006) may resume."""
    return Lost() if code in (protocol.CloseCode.NO_STATUS, protocol.CloseCode.LOST) else Closed()
