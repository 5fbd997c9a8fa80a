"""The websocket protocol of pods and routers: moshi-server's frame limit and liveness.

Both run uvicorn's sans-I/O websocket protocol through :class:`WebSocketProtocol`, a
subclass that changes two policies to moshi-server's:

- Frame limit: ``ws_max_size`` equals ``max_message_bytes`` (16 MiB by default, as
  moshi-server's axum). A larger frame is refused by the parser from its header,
  before its payload is buffered; plain uvicorn (websockets) then closes with 1009 at
  once and says nothing, and the results of the audio before the frame are lost.
  Here the parser reads the frame's payload and discards it (a chunk at a time, never
  buffered whole), parses on behind it, and hands the application, after the
  messages before the frame, a ``websocket.receive`` event that carries the refusal
  (:func:`refused`): ``Error{code:"too_large"}`` naming the sizes, and close 1009.
  The application ends the stream with it once the results of the audio it received
  are out, as moshi-server delivers them.
- A refused handshake (HTTP 401 before the upgrade) is a complete one: plain uvicorn
  logs an ERROR line for each.
- Liveness: moshi-server drops a client it has heard nothing from (no frame of any
  kind) for 20 s, and pings after 10 s. uvicorn pings every ``ws_ping_interval`` and
  drops a client whose pong is late by ``ws_ping_timeout``, even one that sends audio
  all along. Here a late pong drops the client only if nothing at all arrived since
  the ping was sent, and never while the application is not reading (backpressure:
  the client's bytes, pongs included, wait in the socket because of us).

Hand-over: the router relays bytes once a stream is admitted. The protocol puts
itself into the scope (``scope["extensions"][HANDOVER]["protocol"]``); after the
app's ``websocket.accept`` the app calls :meth:`WebSocketProtocol.hand_over` and owns
the raw transport from then on (uvicorn's parser and pings stop; a server shutdown
calls the given callback instead of closing the connection itself).

Send deadline: the kernel keeps at most ``UNSENT_BYTES`` of a websocket connection's
output unsent (``TCP_NOTSENT_LOWAT``; otherwise its send buffer grows to megabytes for
a client that reads nothing, and takes an hour of results to fill), and the
transport's high-water mark is as low. A client that does not read thus soon holds
every send (uvicorn waits for the transport to drain); if that lasts
``send_timeout_seconds`` the connection is aborted (a close would wait for the buffer to
drain, for ever) and :func:`send_timed_out` says so, so that the stream ends as
``too_slow`` and frees its slot, resumable or not. Results at real time are about
1 KB/s, so a client that reads is held only after some 30 s without reading. A ping
not answered in time aborts the connection too.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Callable, Generator, Mapping
from typing import Any, cast

from uvicorn.protocols.websockets import websockets_sansio_impl
from websockets import exceptions, frames, server
from websockets import protocol as ws_protocol
from websockets.http11 import Request

from asrpool.common import protocol

HANDOVER = "asrpool.handover"
UNSENT_BYTES = 16 << 10  # in the kernel, and again in the transport, per connection
REFUSED = "asrpool.refused"  # the key of a receive event that carries a refused frame's Refusal
MASK_BYTES = 4  # a client frame's masking key, after its header


class RefusingConnection(server.ServerProtocol):
    """websockets' server side, but a message over ``max_size`` does not fail the
    connection: its payload is read and discarded as it arrives, parsing goes on behind
    it, and the connection stays open, so that the application can still send (the
    results of the audio before it, its ``Error``) and close. :attr:`parser_exc` is
    the refused frame's ``PayloadTooBig``, until the protocol takes it."""

    def fail(self, code: int, reason: str = "") -> None:
        refused = sys.exception()  # parse() fails the connection from its except clause
        if (code == frames.CloseCode.MESSAGE_TOO_BIG and self.state is ws_protocol.OPEN
                and isinstance(refused, exceptions.PayloadTooBig) and refused.message is None
                and refused.size is not None):
            self.parser = self._skipping(MASK_BYTES + refused.size)
            next(self.parser)
            return
        super().fail(code, reason)

    def _skipping(self, count: int) -> Generator[None]:
        """Read and discard ``count`` bytes, as much as has arrived at a time, then
        parse on (the end of the stream meanwhile: parse() fails the connection)."""
        while count and not (yield from self.reader.at_eof()):
            skipped = yield from self.reader.read_exact(min(count, len(self.reader.buffer)))
            count -= len(skipped)
        yield from self.parse()


class EarlyFrames(RuntimeError):
    """A client sent frames before it had the 101 (RFC 6455 4.1: it must wait): its
    bytes are parsed already, so its connection cannot be relayed."""


class WebSocketProtocol(websockets_sansio_impl.WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol with moshi-server's policies."""

    heard_at = 0.0  # loop time of the last bytes received from the client
    on_shutdown: Callable[[], None] | None = None  # set once the transport is handed over
    send_timeout_seconds: float | None = None  # set by limits.uvicorn_options
    stall_timer: asyncio.TimerHandle | None = None
    send_timed_out = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        built = self.conn  # uvicorn's, rebuilt alike as a RefusingConnection
        self.conn = RefusingConnection(extensions=built.available_extensions,
                                       max_size=self.config.ws_max_size, logger=built.logger)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        bound_unsent(self.transport)

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        if self.response.status_code == 101:
            self.scope["extensions"][HANDOVER] = {"protocol": self}

    def hand_over(self, on_shutdown: Callable[[], None]) -> asyncio.Transport:
        """The raw connection, right after the accept (nothing read since: the 101 was
        written synchronously and the client waits for it before it sends)."""
        if not self.queue.empty() or self.read_paused:
            raise EarlyFrames("the client sent frames before the handshake's response")
        self.stop_keepalive()
        self._unstall()
        self.on_shutdown = on_shutdown
        return self.transport

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.send_timeout_seconds is not None and self.stall_timer is None:
            self.stall_timer = self.loop.call_later(self.send_timeout_seconds, self._send_late)

    def resume_writing(self) -> None:
        self._unstall()
        super().resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._unstall()
        super().connection_lost(exc)

    def _unstall(self) -> None:
        if self.stall_timer is not None:
            self.stall_timer.cancel()
            self.stall_timer = None

    def _send_late(self) -> None:
        self.stall_timer = None
        self.send_timed_out = True
        self.logger.info("%s read nothing for %g s: connection aborted",
                         peer(self.client), self.send_timeout_seconds)
        self.transport.abort()

    def shutdown(self) -> None:
        if self.on_shutdown is not None:
            self.on_shutdown()
            return
        super().shutdown()

    def data_received(self, data: bytes) -> None:
        self.heard_at = self.loop.time()
        super().data_received(data)

    def keepalive_timeout(self) -> None:
        if self.read_paused or self.heard_at > self.ping_sent_at:
            self.pong_timer = None  # alive (or held back by us): ping again later
            self.pending_ping_payload = None
            self.schedule_ping()
            return
        super().keepalive_timeout()
        self.transport.abort()  # its close would wait for a buffer the peer never reads

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
            # A denial (HTTP 401 before the upgrade) completes the handshake; uvicorn
            # forgets to note it and logs "returned without completing handshake" at
            # ERROR for every refused client.
            self.handshake_complete = True

    def handle_parser_exception(self) -> None:
        exc = self.conn.parser_exc
        if isinstance(exc, exceptions.PayloadTooBig) and self.conn.state is ws_protocol.OPEN:
            self.conn.parser_exc = None  # refused, not failed: the connection goes on
            self.handle_events()  # the messages before the frame reach the app first
            # An ASGI receive event with a key of ours, which ASGI's types do not know.
            self.queue.put_nowait(cast(Any, refusal_event(_reason(exc))))
            return
        super().handle_parser_exception()


def refusal_event(reason: str) -> dict[str, Any]:
    """The receive event of a frame refused from its header (no bytes, no text)."""
    refusal = protocol.Refusal(reason, protocol.ErrorCode.TOO_LARGE, protocol.CloseCode.TOO_LARGE)
    return {"type": "websocket.receive", "bytes": None, "text": None, REFUSED: refusal}


def refused(message: Mapping[str, Any]) -> protocol.Refusal | None:
    """The refusal a receive event carries: a frame the parser refused from its header."""
    refusal = message.get(REFUSED)
    return refusal if isinstance(refusal, protocol.Refusal) else None


def bound_unsent(transport: asyncio.Transport) -> None:
    """At most ``UNSENT_BYTES`` unsent in the kernel and as many in the transport before
    its protocol is told to stop writing."""
    sock = transport.get_extra_info("socket")
    if sock is not None and hasattr(socket, "TCP_NOTSENT_LOWAT"):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, UNSENT_BYTES)
    transport.set_write_buffer_limits(high=UNSENT_BYTES)


def send_timed_out(scope: Any) -> bool:
    """Whether the connection of this ASGI scope was aborted by the send deadline."""
    connection = _protocol(scope)
    return connection is not None and connection.send_timed_out


def close_received(scope: Any) -> int | None:
    """The code of the close frame the client of this ASGI scope sent (1005 for one
    without a code), or None if it sent none. uvicorn closes the connection as soon as
    it parses that frame, which may be before the app has read the messages ahead of it
    (while it holds them back), so a failed send can follow a clean close."""
    connection = _protocol(scope)
    close = connection.conn.close_rcvd if connection is not None else None
    return None if close is None else int(close.code)


def _protocol(scope: Any) -> WebSocketProtocol | None:
    """The protocol of this ASGI scope's connection (put there at its upgrade)."""
    handover = scope.get("extensions", {}).get(HANDOVER)
    return cast(WebSocketProtocol, handover["protocol"]) if handover else None


def peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"


def _reason(exc: exceptions.PayloadTooBig) -> str:
    """The sizes as far as the parser knows them (a compressed frame's size is not)."""
    if exc.size is None:
        return f"message exceeds the limit of {exc.max_size} bytes once decompressed"
    return str(protocol.too_large(exc.size + (exc.current_size or 0), exc.max_size))
