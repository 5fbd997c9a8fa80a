"""The websocket protocol of pods and routers: moshi-server's frame limit and liveness.

Both run uvicorn's sans-I/O websocket protocol through :class:`WebSocketProtocol`, a
subclass that changes two policies to moshi-server's:

- Frame limit: a frame over ``max_message_bytes`` (``ws_max_size``, 16 MiB by default,
  as moshi-server's axum), or one that takes a fragmented message over it, is refused by
  the parser from its header, before its payload is buffered; plain uvicorn
  (websockets) then closes with 1009 at once and says nothing, and the results of the
  audio before the frame are lost. Here the parser reads the frame's payload and
  discards it (a chunk at a time, never buffered whole), and so the rest of its message
  (the continuation frames behind it, control frames between them taken as ever), parses
  on behind it, and hands the application, after the messages before the frame, a
  ``websocket.receive`` event that carries the refusal (:func:`refused`):
  ``Error{code:"too_large"}`` naming the sizes, and close 1009. The application ends
  the stream with it once the results of the audio it received are out, as moshi-server
  delivers them. A router refuses such a message itself and tells its pod with a
  ``RouterRefusal`` (``protocol.router_refusal``); when the router had passed the first
  fragments on, the refusal is the message's last fragment, which stands for the whole
  message here, and the parser admits a fragmented message ``ROUTER_REFUSAL_BYTES`` over
  the limit so that it fits (the handler refuses a binary message over it itself).
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
import struct
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
FIN_BIT, RSV_BITS = 0x80, 0x70  # of a frame's first byte
CONTROL_BYTES = 125  # the most payload a control frame may have (RFC 6455 section 5.5)
_READING = frozenset({ws_protocol.OPEN, ws_protocol.CLOSING})  # the client's frames still parsed
_U16, _U64 = struct.Struct("!H"), struct.Struct("!Q")
# (first byte, opcode, header length with the mask, payload length, mask bit)
Header = tuple[int, int, int, int, int]


def header(data: bytes | bytearray, pos: int = 0) -> Header | None:
    """The frame header at ``pos`` (RFC 6455 section 5.2), or None while it is not whole.
    The pod's parser reads a refused message's fragments with it, the router its relay."""
    end = len(data)
    if end - pos < 2:
        return None
    first, second = data[pos], data[pos + 1]
    size, head, masked = second & 0x7F, 2, second & 0x80
    if size == 126:
        if end - pos < 4:
            return None
        size, head = _U16.unpack_from(data, pos + 2)[0], 4
    elif size == 127:
        if end - pos < 10:
            return None
        size, head = _U64.unpack_from(data, pos + 2)[0], 10
    if masked:
        head += MASK_BYTES
        if end - pos < head:
            return None
    return first, first & 0x0F, head, size, masked


class RefusingConnection(server.ServerProtocol):
    """websockets' server side, but a message over ``max_bytes`` does not fail the
    connection: the frame refused from its header is read and discarded as it arrives,
    and so is the rest of its message, parsing goes on behind it, and the connection
    stays open (closing too: the application may have closed it before the client sent
    the rest), so that the application can still send (the results of the audio before
    it, its ``Error``) and close. :attr:`refused` is the last refused frame's
    ``PayloadTooBig``, which the parser leaves in ``parser_exc`` for the protocol."""

    refused: exceptions.PayloadTooBig | None = None

    def __init__(self, max_bytes: int, **kwargs: Any) -> None:
        # A frame over max_bytes is refused; a fragmented message only past the room a
        # router's refusal may take at its end (the handler refuses it over max_bytes).
        super().__init__(max_size=(max_bytes + protocol.ROUTER_REFUSAL_BYTES, max_bytes),
                         **kwargs)
        self.max_bytes = max_bytes

    def fail(self, code: int, reason: str = "") -> None:
        refused = sys.exception()  # parse() fails the connection from its except clause
        if (code == frames.CloseCode.MESSAGE_TOO_BIG and self.state in _READING
                and isinstance(refused, exceptions.PayloadTooBig) and refused.message is None
                and refused.size is not None):
            self.refused = refused
            self.current_size = None  # its message is dropped whole
            # Started by the protocol once it has the refusal (not here: the messages
            # behind the frame must not reach the application before it).
            self.parser = self._dropping(MASK_BYTES + refused.size)
            return
        super().fail(code, reason)

    def _dropping(self, count: int) -> Generator[None]:
        """Discard the refused frame's payload (``count`` bytes, its mask first), then
        the continuation frames of its message, each as it arrives, taking the control
        frames between them as parse() does; then parse on behind the message (a stray
        continuation right behind a refused final frame is dropped as well)."""
        yield from self._skip(count)
        while (got := (yield from self._next_header())) is not None:
            first, opcode, head, size, masked = got
            if opcode >= frames.Opcode.CLOSE and size <= CONTROL_BYTES:
                if not (yield from self._control(head + size)):
                    break  # the stream ended first: parse() fails the connection
                continue
            if opcode != frames.Opcode.CONT or first & RSV_BITS or not masked:
                break  # the message is over, or the frame is bad: parse() tells which
            del self.reader.buffer[:head]
            yield from self._skip(size)
            if first & FIN_BIT:
                break
        yield from self.parse()

    def _skip(self, count: int) -> Generator[None]:
        """Discard ``count`` bytes, as many as have arrived at a time (the end of the
        stream meanwhile: parse() fails the connection)."""
        buffer = self.reader.buffer
        while count and not (yield from self.reader.at_eof()):
            taken = min(count, len(buffer))
            del buffer[:taken]
            count -= taken

    def _next_header(self) -> Generator[None, None, Header | None]:
        """The next frame's header once it is whole (not consumed); None at the end."""
        while (got := header(self.reader.buffer)) is None:
            if self.reader.eof:
                return None
            yield
        return got

    def _control(self, length: int) -> Generator[None, None, bool]:
        """Take the control frame of ``length`` bytes ahead, once it is whole, as parse()
        does (a close or a bad frame replaces this parser, as there); False if the
        stream ended first."""
        while len(self.reader.buffer) < length:
            if self.reader.eof:
                return False
            yield
        try:
            frame = yield from frames.Frame.parse(self.reader.read_exact, mask=True,
                                                  extensions=self.extensions)
            self.recv_frame(frame)
        except exceptions.ProtocolError as exc:
            self.fail(frames.CloseCode.PROTOCOL_ERROR, str(exc))
            self.parser_exc = exc
        except UnicodeDecodeError as exc:
            self.fail(frames.CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
            self.parser_exc = exc
        return True


class EarlyFrames(RuntimeError):
    """A client sent frames before it had the 101 (RFC 6455 4.1: it must wait): its
    bytes are parsed already, so its connection cannot be relayed."""


class WebSocketProtocol(websockets_sansio_impl.WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol with moshi-server's policies."""

    conn: RefusingConnection
    heard_at = 0.0  # loop time of the last bytes received from the client
    on_shutdown: Callable[[], None] | None = None  # set once the transport is handed over
    send_timeout_seconds: float | None = None  # set by limits.uvicorn_options
    stall_timer: asyncio.TimerHandle | None = None
    send_timed_out = False
    # Takes a whole binary message in the protocol's callback (True), or leaves it to be
    # queued for the app's receive (False): set by the app while its reader waits.
    fast_reader: Callable[[bytes], bool] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        built = self.conn  # uvicorn's, rebuilt alike as a RefusingConnection
        self.conn = RefusingConnection(self.config.ws_max_size, logger=built.logger,
                                       extensions=built.available_extensions)

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

    def send_receive_event_to_app(self) -> None:
        """A whole message: to the app's ``fast_reader`` first, if it has one and nothing
        is queued before the message (then no event is made and reading goes on)."""
        take = self.fast_reader
        if (take is not None and self.curr_msg_data_type == "bytes" and not self.close_sent
                and self.queue.empty()):
            data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
            if take(data):
                self.frames = []
                return
        super().send_receive_event_to_app()

    def send_now(self, messages: list[bytes]) -> bool:
        """Send binary messages at once, in one write, if the connection is open and its
        transport takes more now (not paused: else False, and the app's ``send`` waits
        as ever)."""
        if (not self.handshake_complete or self.close_sent or self.disconnected
                or self.initial_response is not None or not self.writable.is_set()
                or self.conn.state is not ws_protocol.OPEN or self.transport.is_closing()):
            return False
        for message in messages:
            self.conn.send_binary(message)
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True

    def handle_cont(self, event: frames.Frame) -> None:
        if event.fin and protocol.decode_router_refusal(event.data) is not None:
            # A router refused this fragmented message after passing its first fragments
            # on, and ended it with its refusal: that stands for the whole message.
            self.frames = []
        super().handle_cont(event)

    def handle_parser_exception(self) -> None:
        refused = self.conn.refused
        if refused is None or self.conn.parser_exc is not refused:
            super().handle_parser_exception()
            return
        self.conn.parser_exc = None  # refused, not failed: the connection goes on
        self.handle_events()  # the messages before the frame reach the app first
        self.frames = []  # the fragments before it, of the message it belongs to
        if self.conn.state is ws_protocol.OPEN:  # else the app has closed: it reads no more
            # An ASGI receive event with a key of ours, which ASGI's types do not know.
            reason = refusal_reason(refused, self.conn.max_bytes)
            self.queue.put_nowait(cast(Any, refusal_event(reason)))
        self.data_received(b"")  # the bytes behind the frame's header, already received


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
    connection = connection_of(scope)
    return connection is not None and connection.send_timed_out


def close_received(scope: Any) -> int | None:
    """The code of the close frame the client of this ASGI scope sent (1005 for one
    without a code), or None if it sent none. uvicorn closes the connection as soon as
    it parses that frame, which may be before the app has read the messages ahead of it
    (while it holds them back), so a failed send can follow a clean close."""
    connection = connection_of(scope)
    close = connection.conn.close_rcvd if connection is not None else None
    return None if close is None else int(close.code)


def connection_of(scope: Any) -> WebSocketProtocol | None:
    """The protocol of this ASGI scope's connection (put there at its upgrade)."""
    handover = scope.get("extensions", {}).get(HANDOVER)
    return cast(WebSocketProtocol, handover["protocol"]) if handover else None


def peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"


def refusal_reason(exc: exceptions.PayloadTooBig, max_bytes: int) -> str:
    """The sizes as far as the parser knows them (a compressed frame's size is not)."""
    if exc.size is None:
        return f"message exceeds the limit of {max_bytes} bytes once decompressed"
    return str(protocol.too_large(exc.size + (exc.current_size or 0), max_bytes))
