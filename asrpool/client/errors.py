"""What a client is told when a stream cannot run, as exceptions: one per refusal code of
the protocol (``Error.code``, or the HTTP status of a refused upgrade), each a
:class:`StreamError`, so that a caller catches them all at once or branches on the one
it can act on (wait and retry on :class:`Busy`, fix the key on :class:`Unauthorized`).
"""

from __future__ import annotations

from asrpool.common import protocol
from asrpool.common.protocol import ErrorCode


class StreamError(RuntimeError):
    """The stream could not run or was cut; the message says why, in one line."""


class Refused(StreamError):
    """The platform refused or ended the stream; ``code`` is the protocol's."""

    code: str = ""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code or type(self).code


# The ones a caller acts on (their codes: docs/reference/protocol.md).


class Busy(Refused):
    """No free slot: try again shortly."""

    code = ErrorCode.BUSY


class QueueFull(Refused):
    """The waiting room is full."""

    code = ErrorCode.QUEUE_FULL


class KeyLimit(Refused):
    """The API key's streams are all in use."""

    code = ErrorCode.KEY_LIMIT


class KeyQueueFull(Refused):
    """The API key's waiting streams are at their limit."""

    code = ErrorCode.KEY_QUEUE_FULL


class Unauthorized(Refused):
    """A missing or unknown API key (HTTP 401)."""

    code = ErrorCode.UNAUTHORIZED


class ForbiddenPool(Refused):
    """The API key may not use this pool (HTTP 403)."""

    code = ErrorCode.UNAUTHORIZED


class TooManyStreams(Refused):
    """Over the new streams per second (HTTP 429): slow down."""

    code = ErrorCode.TOO_MANY_STREAMS


class UnknownPool(Refused):
    """No such pool."""

    code = ErrorCode.UNKNOWN_POOL


class Unavailable(Refused):
    """The router cannot reach its registry: try again shortly."""

    code = ErrorCode.UNAVAILABLE


class Draining(Refused):
    """The server or router is shutting down."""

    code = ErrorCode.DRAINING


class PodLost(Refused):
    """The pod serving the stream failed."""

    code = ErrorCode.POD_LOST


class BadResumeToken(Refused):
    """The stream to resume is gone."""

    code = ErrorCode.BAD_RESUME_TOKEN


class IdleTimeout(Refused):
    """The client sent nothing."""

    code = ErrorCode.IDLE_TIMEOUT


class TooSlow(Refused):
    """The client did not read its results."""

    code = ErrorCode.TOO_SLOW


class Overloaded(Refused):
    """The pod fell behind real time."""

    code = ErrorCode.OVERLOADED


class BadInput(Refused):
    """The server refused a message (its code says which kind)."""

    code = ErrorCode.BAD_MESSAGE


BY_CODE: dict[str, type[Refused]] = {
    cls.code: cls for cls in (Busy, QueueFull, KeyLimit, KeyQueueFull, Unauthorized,
                              TooManyStreams, UnknownPool, Unavailable, Draining, PodLost,
                              BadResumeToken, IdleTimeout, TooSlow, Overloaded)}
# A message the server refused, whatever its code: one error, the code says which.
BAD_INPUT_CODES = frozenset(str(code) for code in (
    ErrorCode.MALFORMED, ErrorCode.BAD_MESSAGE, ErrorCode.UNKNOWN_TYPE, ErrorCode.BAD_AUDIO,
    ErrorCode.MIXED_AUDIO, ErrorCode.TOO_LARGE, ErrorCode.TOO_MANY_MESSAGES,
    ErrorCode.TOO_MANY_MARKERS))
BY_STATUS: dict[int, type[Refused]] = {401: Unauthorized, 403: ForbiddenPool,
                                       429: TooManyStreams, 503: Unavailable}


def from_error(message: dict[str, object]) -> Refused:
    """The exception for an ``Error`` message."""
    code, text = str(message.get("code") or ""), str(message.get("message") or "")
    kind = BadInput if code in BAD_INPUT_CODES else BY_CODE.get(code, Refused)
    return kind(f"server error ({code or 'no code'}): {text}", code)


def from_status(status: int) -> Refused:
    """The exception for an upgrade refused with HTTP ``status``."""
    kind = BY_STATUS.get(status, Refused)
    if status == 401:
        return kind("authentication failed (HTTP 401): check the API key", protocol.UNAUTHORIZED)
    return kind(f"the server refused the websocket upgrade (HTTP {status})")
