"""The client protocol: Kyutai moshi-server STT over a websocket, as MessagePack maps.

Both the server pod and the router speak it on ``GET /api/asr-streaming``. Every
binary frame is one MessagePack map with a ``"type"`` field; text frames are ignored.
Extensions (resume tokens, pod tokens) travel in HTTP headers of the upgrade, so a
plain Kyutai client never sees a message it cannot parse.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Literal, TypedDict

import msgpack
import numpy as np
from numpy.typing import NDArray

SAMPLE_RATE = 24_000
FRAME_SIZE = 1920  # samples per model step (80 ms)
FRAME_RATE = SAMPLE_RATE / FRAME_SIZE  # 12.5 Hz
STREAMING_PATH = "/api/asr-streaming"

API_KEY_HEADER = "kyutai-api-key"
API_KEY_QUERY = "auth_id"
POD_TOKEN_HEADER = "asrpool-pod-token"
RESUME_TOKEN_HEADER = "asrpool-resume-token"
SESSION_ID_HEADER = "asrpool-session-id"
# Resume: the samples the pod had received (response), the messages the client had
# received before the drop (request), so each side replays only what the other missed.
RESUME_OFFSET_HEADER = "asrpool-resume-offset"
RESUME_RECEIVED_HEADER = "asrpool-resume-received"
# A client that may come back sends ``asrpool-resumable: 1`` (the router always does):
# only its stream is kept for the resume grace after a lost connection. Every other
# close or drop frees the slot at once, as moshi-server does.
RESUMABLE_HEADER = "asrpool-resumable"
RESUME_FIELDS = (RESUMABLE_HEADER, RESUME_TOKEN_HEADER, RESUME_RECEIVED_HEADER)
# A browser cannot set a websocket's headers nor read its 101's: it sends the resume
# fields as query parameters of the same names, and the router tells it its token and
# offset in band, right after the Ready, in this message (counted by neither side).
RESUMABLE_MESSAGE = "Resumable"
_MAX_COUNT_DIGITS = 18  # any real count of messages fits; int() of more is slow or refused

# moshi-server (axum) takes websocket frames up to 16 MiB: a 10 s float32 chunk is 1.2 MB.
DEFAULT_MAX_MESSAGE_BYTES = 16 << 20
BUSY_MESSAGE = "no free channels"
# The body of every HTTP 401 (API key or pod token): it does not say which check failed.
UNAUTHORIZED = "unauthorized"
# A plain GET of the streaming path (no upgrade): HTTP 426, as a websocket server answers.
UPGRADE_REQUIRED = "upgrade to a websocket, or POST a WAV/FLAC/OGG/MP3 file"
# Samples are float full scale (-1..1). Beyond 16 (24 dB over full scale) a sample is
# no audio (int16 values sent as floats, garbage), and finite but huge ones (3e38)
# overflow Mimi's convolutions into NaN: refused (``bad_audio``), never clipped, so a
# broken client hears why instead of getting a quiet wrong transcript.
MAX_AMPLITUDE = 16.0


class CloseCode(enum.IntEnum):
    """Websocket close codes the pods and routers send (RFC 6455 section 7.4.1)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002  # a frame a server must refuse
    NO_STATUS = 1005  # never sent: a close frame without a code, as received
    LOST = 1006  # never sent: no close frame at all
    POLICY = 1008  # bad input, bad resume token
    TOO_LARGE = 1009
    INTERNAL = 1011  # the pod was lost
    RESTART = 1012  # the pod or router is shutting down
    TRY_AGAIN = 1013  # busy, draining, loading
    TLS = 1015  # never sent


class ErrorCode(enum.StrEnum):
    """The ``code`` of every ``Error`` the pods and routers send: stable machine names
    that clients branch on (docs/reference/protocol.md lists each; a test holds it to this)."""

    # A client message the pod refuses.
    MALFORMED = "malformed"  # not MessagePack
    BAD_MESSAGE = "bad_message"  # MessagePack, but not a valid message
    UNKNOWN_TYPE = "unknown_type"
    BAD_AUDIO = "bad_audio"  # NaN, infinite or loud samples; bad Ogg Opus
    MIXED_AUDIO = "mixed_audio"  # Audio and OggOpus in one stream
    TOO_LARGE = "too_large"
    TOO_MANY_MESSAGES = "too_many_messages"
    TOO_MANY_MARKERS = "too_many_markers"
    # The pod ends or refuses the stream.
    BUSY = "busy"
    DRAINING = "draining"
    BAD_RESUME_TOKEN = "bad_resume_token"
    IDLE_TIMEOUT = "idle_timeout"
    TOO_SLOW = "too_slow"
    OVERLOADED = "overloaded"  # shed: the pod fell too far behind real time
    TOO_MANY_STREAMS = "too_many_streams"
    UNAUTHORIZED = "unauthorized"
    INTERNAL = "internal"
    # The router refuses or ends the stream.
    UNKNOWN_POOL = "unknown_pool"
    KEY_LIMIT = "key_limit"
    QUEUE_FULL = "queue_full"
    KEY_QUEUE_FULL = "key_queue_full"
    POD_LOST = "pod_lost"
    UNAVAILABLE = "unavailable"
    CLIENT_LEFT = "client_left"  # nobody to tell: for the metrics


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A pod or a router ends or refuses a stream: the client gets
    ``Error{message, code}`` (plus ``extra`` fields, which a plain client ignores), then
    ``close_code``. The one type for both (the pod's ``outcomes.Failed``, the router's
    ``refusals.Refusal``)."""

    message: str
    code: ErrorCode
    close_code: CloseCode = CloseCode.POLICY
    extra: tuple[tuple[str, float], ...] = ()

    def frame(self) -> bytes:
        return error(self.message, self.code, **dict(self.extra))


def error_code(text: str) -> ErrorCode:
    """The code a pod sent, as one of ours; one this version does not know is
    ``internal`` (a router and its pods run one version)."""
    try:
        return ErrorCode(text)
    except ValueError:
        return ErrorCode.INTERNAL


def resume_received(headers: Any) -> int | ProtocolError | None:
    """The ``asrpool-resume-received`` count (None when absent), or why it is malformed:
    ASCII digits only (``str.isdigit`` takes ``²``, ``int`` refuses 5,000 digits)."""
    text = headers.get(RESUME_RECEIVED_HEADER)
    if text is None:
        return None
    if not 0 < len(text) <= _MAX_COUNT_DIGITS or not text.isascii() or not text.isdigit():
        shown = text if len(text) <= 20 else text[:20] + "..."
        return ProtocolError(f"{RESUME_RECEIVED_HEADER} must be a count of messages "
                             f"(at most {_MAX_COUNT_DIGITS} digits 0-9), got {shown!r}",
                             ErrorCode.BAD_MESSAGE)
    return int(text)


def resumable(headers: Any) -> bool:
    """Whether an upgrade request asks for its stream to be kept after a lost connection."""
    return headers.get(RESUMABLE_HEADER, "") == "1" or bool(headers.get(RESUME_TOKEN_HEADER))


class AudioMessage(TypedDict):
    type: Literal["Audio"]
    pcm: NDArray[np.float32]  # float32, mono, 24 kHz


class MarkerMessage(TypedDict):
    type: Literal["Marker"]
    id: int


class OggOpusMessage(TypedDict):
    type: Literal["OggOpus"]
    data: bytes  # a piece of an Ogg Opus stream (pages may be split across messages)


class InitMessage(TypedDict):
    type: Literal["Init"]


ClientMessage = AudioMessage | MarkerMessage | OggOpusMessage | InitMessage


class ProtocolError(ValueError):
    """A client message that cannot be accepted; ``code`` is a stable machine name."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.BAD_MESSAGE) -> None:
        super().__init__(message)
        self.code = code


def encode(message: dict[str, Any]) -> bytes:
    """Pack one outgoing message (``Ready``, ``Word``, ``EndWord``, ``Marker``, ...).
    A ``Step``'s ``prs`` are float32, its only floats, as moshi-server's (``Vec<f32>``);
    word times stay float64, as there."""
    packed: bytes = msgpack.packb(message, use_bin_type=True,
                                  use_single_float=message.get("type") == "Step")
    return packed


def ready() -> bytes:
    return encode({"type": "Ready"})


def error(message: str, code: ErrorCode | None = None, **extra: Any) -> bytes:
    """``Error{message[, code]}``, plus extension fields (a plain client ignores them)."""
    body: dict[str, Any] = {"type": "Error", "message": message, **extra}
    if code is not None:
        body["code"] = str(code)
    return encode(body)


def too_large(size: int, max_bytes: int) -> ProtocolError:
    return ProtocolError(
        f"message of {size} bytes exceeds the limit of {max_bytes} bytes", ErrorCode.TOO_LARGE)


ROUTER_REFUSAL_TYPE = "RouterRefusal"
# The most bytes a router's refusal takes: the pod's frame parser admits a fragmented
# message this much over the limit, so that a refusal ending one still fits
# (asrpool.common.framing); the pod's handler refuses any binary message over the limit.
ROUTER_REFUSAL_BYTES = 256
_ROUTER_REFUSAL_TEXT = 160  # characters of its message: it stays within the bytes above


def router_refusal(refusal: Refusal) -> bytes:
    """A router's message to its pod, in the client's place: the router refused the
    client's message itself from a frame's header (over the size limit), so the pod never
    sees it whole. The pod ends the stream with ``refusal`` as with a bad message of its
    own: the results of the audio it received, then the ``Error``, then the close. It is
    a message of its own between the client's, or the last fragment of a fragmented
    message whose first fragments the router had passed on (the pod drops those)."""
    return encode({"type": ROUTER_REFUSAL_TYPE, "message": refusal.message[:_ROUTER_REFUSAL_TEXT],
                   "code": str(refusal.code), "close_code": int(refusal.close_code)})


def decode_router_refusal(data: bytes | bytearray | memoryview) -> Refusal | None:
    """The refusal in a :func:`router_refusal` message; None for any other bytes. Taken
    from anyone, routers or not (a client reaches a pod without a pod token directly):
    it is only ever a message over the size limit, which a client that forges one could
    as well have sent to end its own stream."""
    if len(data) > ROUTER_REFUSAL_BYTES:
        return None
    try:
        body = msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.UnpackException):  # every way msgpack says 'not msgpack'
        return None
    if not isinstance(body, dict) or body.get("type") != ROUTER_REFUSAL_TYPE:
        return None
    message = body.get("message")
    if (not isinstance(message, str) or body.get("code") != ErrorCode.TOO_LARGE
            or body.get("close_code") != CloseCode.TOO_LARGE):
        return None
    return Refusal(message, ErrorCode.TOO_LARGE, CloseCode.TOO_LARGE)


def decode_client(data: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> ClientMessage:
    """Parse and validate one binary frame from a client.

    Raises :class:`ProtocolError` naming what is wrong; never returns a half-valid message.
    """
    if len(data) > max_bytes:
        raise too_large(len(data), max_bytes)
    samples = audio_samples(data)
    if samples is not None:
        return {"type": "Audio", "pcm": _checked_pcm(samples)}
    return decode_unpacked(data)


def decode_unpacked(data: bytes) -> ClientMessage:
    """:func:`decode_client` by a full MessagePack unpacking (every shape of message)."""
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
        raise ProtocolError(f"malformed MessagePack ({reason})", ErrorCode.MALFORMED) from exc
    if not isinstance(body, dict):
        raise ProtocolError(f"expected a MessagePack map, got {type(body).__name__}")
    kind = body.get("type")
    if kind == "Audio":
        return {"type": "Audio", "pcm": _pcm(body.get("pcm"))}
    if kind == "Marker":
        return {"type": "Marker", "id": _marker_id(body.get("id"))}
    if kind == "OggOpus":
        return {"type": "OggOpus", "data": _opus_data(body.get("data"))}
    if kind == "Init":
        return {"type": "Init"}
    if kind is None:
        raise ProtocolError("message has no 'type' field")
    raise ProtocolError(f"unknown message type {kind!r}", ErrorCode.UNKNOWN_TYPE)


def _pcm(value: Any) -> NDArray[np.float32]:
    if isinstance(value, bytes | bytearray):
        raise ProtocolError("'pcm' must be an array of floats, got bytes")
    if not isinstance(value, list | tuple):
        raise ProtocolError(f"'pcm' must be an array of floats, got {type(value).__name__}")
    try:
        raw = np.asarray(value) if value else np.zeros(0, dtype=np.float32)
    except ValueError as exc:  # ragged nesting
        raise ProtocolError("'pcm' must be a flat array of numbers") from exc
    if raw.ndim != 1 or raw.dtype.kind not in "fiu":
        raise ProtocolError("'pcm' must be a flat array of numbers")
    return _checked_pcm(raw)


def _checked_pcm(raw: NDArray[Any]) -> NDArray[np.float32]:
    """Numbers as float32 samples, refused (``bad_audio``) when they cannot be audio."""
    if raw.dtype == np.float32:  # as Kyutai's clients send: no cast (raw is a fresh array)
        pcm = raw
    else:
        with np.errstate(over="ignore"):  # a float beyond float32's range: checked on raw
            pcm = raw.astype(np.float32)
    problem = sample_problem(raw if raw.dtype.kind == "f" else pcm)
    if problem is not None:
        raise ProtocolError(f"'pcm' {problem}", ErrorCode.BAD_AUDIO)
    return pcm


# The Audio frame as Kyutai's clients pack it: a map of two entries, "type": "Audio" and
# "pcm": an array whose every element is a float32 (0xca, 4 bytes big-endian) or every
# one a float64 (0xcb, 8 bytes). Its samples are read straight from the bytes by numpy.
_AUDIO_TYPE = b"\xa4type\xa5Audio"
_PCM_KEY = b"\xa3pcm"
_TWO_ENTRIES = 0x82
_TAGGED_FLOATS = {0xca: np.dtype([("tag", "u1"), ("value", ">f4")]),
                  0xcb: np.dtype([("tag", "u1"), ("value", ">f8")])}


def audio_samples(data: bytes) -> NDArray[np.floating[Any]] | None:
    """The samples of an Audio frame of that common shape, as sent (float32 or
    float64, in native byte order), in one vectorised pass; None for any other frame, which
    :func:`decode_unpacked` then reads, with its own errors. The two agree on every frame
    both read (a test packs them all ways)."""
    if len(data) < 1 + len(_AUDIO_TYPE) + len(_PCM_KEY) + 2 or data[0] != _TWO_ENTRIES:
        return None
    if data.startswith(_AUDIO_TYPE, 1) and data.startswith(_PCM_KEY, 1 + len(_AUDIO_TYPE)):
        return _float_array(data, 1 + len(_AUDIO_TYPE) + len(_PCM_KEY), len(data))
    if data.startswith(_PCM_KEY, 1) and data.endswith(_AUDIO_TYPE):
        return _float_array(data, 1 + len(_PCM_KEY), len(data) - len(_AUDIO_TYPE))
    return None


def _float_array(data: bytes, start: int, end: int) -> NDArray[np.floating[Any]] | None:
    """The MessagePack array that fills ``data[start:end]`` exactly, if every element is a
    float of one width; else None."""
    head = data[start]
    if 0x90 < head <= 0x9f:
        count, start = head & 0x0f, start + 1
    elif head == 0xdc and end - start >= 3:
        count, start = int.from_bytes(data[start + 1:start + 3], "big"), start + 3
    elif head == 0xdd and end - start >= 5:
        count, start = int.from_bytes(data[start + 1:start + 5], "big"), start + 5
    else:
        return None
    if not count or start >= end:
        return None
    tag = data[start]
    element = _TAGGED_FLOATS.get(tag)
    if element is None or end - start != count * element.itemsize:
        return None
    if data[start:end:element.itemsize] != bytes((tag,)) * count:  # every element's tag
        return None
    tagged = np.frombuffer(data, dtype=element, count=count, offset=start)
    values: NDArray[np.floating[Any]] = tagged["value"].astype(
        tagged.dtype["value"].newbyteorder("="))
    return values


def sample_problem(pcm: NDArray[np.floating[Any]]) -> str | None:
    """Why these samples cannot be audio (NaN, infinite, beyond :data:`MAX_AMPLITUDE`),
    or None: the one check every way audio comes in (frames, Opus, files) goes through."""
    if pcm.size == 0:
        return None
    peak = float(np.abs(pcm).max())  # NaN if any sample is NaN: one pass for good audio
    if peak <= MAX_AMPLITUDE:
        return None
    if not np.isfinite(pcm).all():
        return "contains NaN or infinite samples"
    return (f"has a sample of amplitude {peak:.3g}, over the limit of "
            f"{MAX_AMPLITUDE:g} (samples are floats in -1..1)")


def _opus_data(value: Any) -> bytes:
    if not isinstance(value, bytes | bytearray):
        raise ProtocolError(f"'data' of OggOpus must be bytes, got {type(value).__name__}")
    return bytes(value)


def _marker_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"'id' of a Marker must be an integer, got {value!r}")
    if not -(2**63) <= value < 2**63:
        raise ProtocolError("'id' of a Marker is out of the 64-bit range")
    return value
