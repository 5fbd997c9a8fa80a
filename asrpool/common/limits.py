"""What one connection may cost a pod or a router, before and after authentication.

Pods and routers alike (both build their ``uvicorn.Config`` with
:func:`uvicorn_options`):

- The request head (request line and headers) is parsed by h11, not httptools, which
  buffers a head of any size: h11 stops at ``max_head_bytes`` (its
  ``max_incomplete_event_size``) and the client gets HTTP 431.
- A head that is not complete ``handshake_timeout_seconds`` after the connection opened (or
  after its first byte, on a kept-alive connection) is HTTP 408 and closed: half-open
  handshakes do not stay.
- A process holds at most ``max_connections`` connections (HTTP, websocket, relayed):
  one more is HTTP 503 and closed at once, before it is read.
- A request line over ``max_url_bytes`` is HTTP 414; more than ``max_headers``
  header lines, or one longer than websockets' handshake parser takes (8 KiB), HTTP
  431: checked on h11's request event, before the websocket handshake or the app
  (and its query parsing) sees the request.
- A new stream (any websocket upgrade, a resume too) is let through only if the
  process's :class:`StreamGate` admits it (new streams per second: one bucket for a
  pod process, one per client address on a router; a pod lets its routers' resumes
  pass, so that the clients of a router that died all come back); else HTTP 429 with
  ``Retry-After``, answered from the request head: no websocket handshake, no
  application, no slot, no log line. The answer is held back ``THROTTLED_HOLD_S``
  (the connection is not read meanwhile): a client that retries at once makes one
  attempt a second per connection, not hundreds, and one that honours ``Retry-After``
  waits no longer than it would have. A gate may answer a trusted caller at once
  (``Throttled.held``: a router link with the pod token, which tells its own client).
- Sends to a websocket client that does not read have a deadline: a connection whose
  write buffer stays over its high-water mark for ``send_timeout_seconds`` is aborted
  (:class:`asrpool.common.framing.WebSocketProtocol`; the router's relay does the same).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from http import HTTPStatus
from typing import Annotated, Any, Protocol

import h11
import pydantic
from uvicorn.protocols.http import h11_impl
from websockets import http11

from asrpool.common import bodies, browsers, framing, protocol, rates

# Intake processes of a pod beside a GPU (the server's --intake-workers unset, a GPU
# pool's intakeWorkers unset): at 1,024 paced streams two kept the pod's event loop under
# 20 us per stream-step (bench server --intake-workers 2).
GPU_INTAKE_WORKERS = 2
# A pod's slots at most: the server's --batch-size, and a pool's slotsPerPod (the CRD's
# rule states it, and a test holds the two equal).
MAX_SLOTS_PER_POD = 4096

DEFAULT_MAX_HEAD_BYTES = 32 << 10
DEFAULT_MAX_HEADERS = 100  # as hyper (moshi-server's HTTP stack)
DEFAULT_MAX_URL_BYTES = 4 << 10  # the request line; websockets refuses one over 8 KiB
MAX_LINE_BYTES = http11.MAX_LINE_LENGTH  # a header line the websocket handshake takes
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
DEFAULT_SEND_TIMEOUT_S = 5.0
THROTTLED_HOLD_S = 1.0  # a 429's Retry-After is 1 s at least


@dataclasses.dataclass(frozen=True)
class Limits:
    max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES
    max_headers: int = DEFAULT_MAX_HEADERS
    max_url_bytes: int = DEFAULT_MAX_URL_BYTES
    handshake_timeout_seconds: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    max_connections: int = 2048
    send_timeout_seconds: float = DEFAULT_SEND_TIMEOUT_S
    allowed_origins: tuple[str, ...] = ()  # browsers.origins
    upload_content_types: tuple[str, ...] = browsers.entries(browsers.DEFAULT_UPLOAD_TYPES)
    keyless: bool = False  # no API key asked: browsers.origin_problem


MaxConnections = Annotated[int, pydantic.Field(
    ge=2, description="connections one process holds at most (a router's: per worker); one"
    " more is HTTP 503 at once")]


class LimitSettings(pydantic.BaseModel):
    """The settings of :class:`Limits`, shared by the pod's and the router's settings.
    Only ``max_connections`` differs between them: a class changes its default alone,
    ``max_connections: limits.MaxConnections = 16384``."""

    max_head_bytes: int = pydantic.Field(
        default=DEFAULT_MAX_HEAD_BYTES, ge=1024,
        description="largest request line and headers in bytes (else HTTP 431)")
    max_headers: int = pydantic.Field(
        default=DEFAULT_MAX_HEADERS, ge=8, description="most request header lines (else 431)")
    max_url_bytes: int = pydantic.Field(
        default=DEFAULT_MAX_URL_BYTES, ge=256,
        description="longest request target, path and query, in bytes (else 414)")
    handshake_timeout_seconds: float = pydantic.Field(
        default=DEFAULT_HANDSHAKE_TIMEOUT_S, gt=0,
        description="a request head must be complete this soon after the connection opened"
        " (else 408)")
    max_connections: MaxConnections = Limits.max_connections
    send_timeout_seconds: float = pydantic.Field(
        default=DEFAULT_SEND_TIMEOUT_S, gt=0,
        description="a websocket client whose unsent data stay over the write buffer's"
        " high-water mark this long is dropped")

    allowed_origins: str = pydantic.Field(
        default="", description="web origins (comma-separated, * any) whose pages may stream"
        " or POST here; none but the server's own by default (else HTTP 403)")
    upload_content_types: str = pydantic.Field(
        default=browsers.DEFAULT_UPLOAD_TYPES, description="content types a POST may have"
        " (comma-separated, type/* a family; else HTTP 415)")

    def asks_no_key(self) -> bool:
        """Whether anyone may stream here without a key (each server's settings say)."""
        return False

    @property
    def connection_limits(self) -> Limits:
        given: dict[str, Any] = {field.name: getattr(self, field.name)
                                 for field in dataclasses.fields(Limits)
                                 if field.name != "keyless"}
        given["keyless"] = self.asks_no_key()
        given["allowed_origins"] = browsers.origins(self.allowed_origins)
        given["upload_content_types"] = browsers.entries(self.upload_content_types)
        return Limits(**given)


class StreamSettings(pydantic.BaseModel):
    """What a websocket client may send and how long it may stay silent, for pod and
    router alike. As moshi-server: messages up to 16 MiB; a client answering no ping
    (one every 10 s) within 10 s is gone, 20 s without any frame."""

    max_message_bytes: int = pydantic.Field(
        default=protocol.DEFAULT_MAX_MESSAGE_BYTES, ge=1024,
        description="largest client message accepted (larger: too_large)")
    max_upload_bytes: int = pydantic.Field(
        default=64 << 20, ge=1024, description="largest POST /api/asr-streaming body")
    # As nginx's client_body_timeout: a slow body holds memory and a connection.
    body_timeout_seconds: float = pydantic.Field(
        default=60.0, gt=0, description="longest wait for the next piece of a POST body"
        " (else HTTP 408)")
    min_body_bytes_per_second: int = pydantic.Field(
        default=8192, ge=0, description="slowest average pace of a POST body once"
        " body_timeout_seconds have passed (else 408; 0: any pace)")
    ping_interval_seconds: float = pydantic.Field(
        default=10.0, gt=0, description="websocket ping period towards clients")
    ping_timeout_seconds: float = pydantic.Field(
        default=10.0, gt=0, description="drop a client not answering a ping within this")
    # A pod keeps a dropped stream's slot this long; a router, the stream's record (keep
    # a router's at least its pods').
    resume_grace_seconds: float = pydantic.Field(
        default=30.0, ge=0, description="how long a dropped stream waits for its client to"
        " resume (0: no resume; a router's at least its pods')")

    @property
    def body_pace(self) -> bodies.Pace:
        return bodies.Pace(self.body_timeout_seconds, self.min_body_bytes_per_second)


class StreamGate(Protocol):
    def new_stream(self, address: str, headers: Sequence[tuple[bytes, bytes]]
                   ) -> rates.Throttled | None:
        """Why a new stream from ``address`` (the peer's) with these request headers is
        refused now (counted), or None."""


# (status, text, extra headers) of a request refused from its head
Problem = tuple[HTTPStatus, str, tuple[tuple[str, str], ...]]
_RESUME_HEADER = protocol.RESUME_TOKEN_HEADER.lower().encode()


def uvicorn_options(limits: Limits, gate: StreamGate | None = None) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.Config`` that apply ``limits`` (and ``gate``)."""
    return {
        "http": _configured(H11Protocol, limits=limits, gate=gate),
        "ws": _configured(framing.WebSocketProtocol,
                          send_timeout_seconds=limits.send_timeout_seconds),
        "h11_max_incomplete_event_size": limits.max_head_bytes,
        # No permessage-deflate, on pods as on routers: a 16 KiB compressed frame could
        # inflate to the whole frame limit of audio work, and relayed frames pass unchanged.
        "ws_per_message_deflate": False,
    }


def _configured(base: type[Any], **attributes: Any) -> type[Any]:
    """A subclass of ``base`` with these class attributes (uvicorn builds protocols
    from a class and its own config alone)."""
    return type(base.__name__, (base,), attributes)


def refusal(status: HTTPStatus, text: str, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A whole HTTP/1.1 response that closes the connection."""
    body = text.encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
    head = (f"HTTP/1.1 {status.value} {status.phrase}\r\ncontent-type: text/plain; "
            f"charset=utf-8\r\ncontent-length: {len(body)}\r\n{extra}connection: close\r\n"
            "\r\n")
    return head.encode() + body


class Connection(h11.Connection):
    """h11's server connection that refuses a request beyond the limits as a protocol
    error (uvicorn then answers it through ``send_400_response``), naming why."""

    def __init__(self, limits: Limits, gate: StreamGate | None = None) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=limits.max_head_bytes)
        self.limits = limits
        self.gate = gate
        self.client = ""  # the peer's address, for the gate
        self.problem: Problem | None = None
        self.throttled: rates.Throttled | None = None

    def next_event(self) -> Any:
        event = super().next_event()
        if isinstance(event, h11.Request):
            self.problem = request_problem(event, self.limits)
            if self.problem is not None:
                raise h11.RemoteProtocolError(self.problem[1], self.problem[0].value)
            self.throttled = self._gated(event)
            if self.throttled is not None:  # H11Protocol answers it, later and quietly
                return h11.PAUSED
        return event

    def _gated(self, request: h11.Request) -> rates.Throttled | None:
        if self.gate is None or not websocket_upgrade(request):
            return None
        return self.gate.new_stream(self.client, request.headers)


def websocket_upgrade(request: h11.Request) -> bool:
    """A request for a stream: new, or a resume (a resume costs a lookup too, and a
    forged token is as cheap to send as a new stream)."""
    return any(name == b"upgrade" for name, _ in request.headers)


def resuming(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """Whether an upgrade's headers (as h11 gives them, lower-case) ask for a resume."""
    return any(name == _RESUME_HEADER for name, _ in headers)


def request_problem(request: h11.Request, limits: Limits) -> Problem | None:
    if len(request.target) > limits.max_url_bytes:
        return HTTPStatus.REQUEST_URI_TOO_LONG, (
            f"URL of {len(request.target)} bytes is over the limit of {limits.max_url_bytes}"), ()
    if len(request.headers) > limits.max_headers:
        return HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, (
            f"{len(request.headers)} header lines are over the limit of {limits.max_headers}"), ()
    longest = max((len(name) + len(value) + 2 for name, value in request.headers), default=0)
    if longest > MAX_LINE_BYTES:
        return HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, (
            f"a header line of {longest} bytes is over the limit of {MAX_LINE_BYTES}"), ()
    return _browser_problem(request, limits)


def _browser_problem(request: h11.Request, limits: Limits) -> Problem | None:
    """What a page elsewhere may not have its visitors' browsers send (browsers)."""
    posted = request.method == b"POST"
    if not (posted or websocket_upgrade(request)):
        return None
    problem = browsers.origin_problem(request.headers, limits.allowed_origins, limits.keyless)
    if problem is not None:
        return HTTPStatus.FORBIDDEN, problem, ()
    problem = browsers.content_type_problem(request.headers, limits.upload_content_types) \
        if posted else None
    return (HTTPStatus.UNSUPPORTED_MEDIA_TYPE, problem, ()) if problem is not None else None


class H11Protocol(h11_impl.H11Protocol):
    """uvicorn's h11 protocol with a connection cap, a head deadline, bounded requests
    (431, 414) and a gate for new streams (429)."""

    limits = Limits()
    gate: StreamGate | None = None
    head_timer: asyncio.TimerHandle | None = None
    hold_timer: asyncio.TimerHandle | None = None
    refused = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = Connection(self.limits, self.gate)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        assert isinstance(self.conn, Connection)
        self.conn.client = self.client[0] if self.client else ""
        if len(self.connections) > self.limits.max_connections:
            self.refuse(HTTPStatus.SERVICE_UNAVAILABLE,
                        f"over {self.limits.max_connections} connections; try again later")
            return
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        super().data_received(data)
        assert isinstance(self.conn, Connection)
        if self.conn.throttled is not None:
            self._hold(self.conn.throttled)
        elif self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self.head_timer is None:  # a head has begun on a kept-alive connection
                self._arm_head_timer()
        else:
            self._disarm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        if self.hold_timer is not None:
            self.hold_timer.cancel()
        super().connection_lost(exc)

    def _hold(self, throttled: rates.Throttled) -> None:
        """Answer a throttled request, after ``THROTTLED_HOLD_S`` unless the gate said
        not to (``Throttled.held``), reading nothing more."""
        self.refused = True
        self._disarm_head_timer()
        self.transport.pause_reading()
        self.hold_timer = self.loop.call_later(
            THROTTLED_HOLD_S if throttled.held else 0.0, self.refuse,
            HTTPStatus(throttled.status), throttled.message, tuple(throttled.headers.items()))

    def send_400_response(self, msg: str) -> None:
        assert isinstance(self.conn, Connection)
        if self.conn.problem is not None:
            self.refuse(*self.conn.problem)
            return
        if len(self.conn.trailing_data[0]) > self.limits.max_head_bytes:
            self.refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                        f"request head over {self.limits.max_head_bytes} bytes")
            return
        super().send_400_response(msg)

    def refuse(self, status: HTTPStatus, text: str,
               headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.refused = True
        self._disarm_head_timer()
        # Over the rate a client is refused hundreds of times a second: no log line each
        # (the metrics count them).
        level = logging.DEBUG if status is HTTPStatus.TOO_MANY_REQUESTS else logging.INFO
        self.logger.log(level, "%s refused: %d %s", framing.peer(self.client), status.value,
                        text)
        self.transport.write(refusal(status, text, headers))
        self.transport.close()

    def _arm_head_timer(self) -> None:
        self.head_timer = self.loop.call_later(self.limits.handshake_timeout_seconds,
                                               self._head_late)

    def _disarm_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_late(self) -> None:
        self.head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.refuse(HTTPStatus.REQUEST_TIMEOUT,
                        "request head not complete within"
                        f" {self.limits.handshake_timeout_seconds:g} s")
