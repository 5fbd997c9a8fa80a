"""The router's TCP connection to a pod: a websocket handshake, then raw bytes.

:func:`dial` connects, sends the upgrade request (websockets' sans-I/O client builds
it and checks the 101: no extension is offered, so frames pass through unchanged),
and reads the pod's first frame. From then on the :class:`PodLink` is a plain asyncio
protocol: whatever the pod sends goes to its ``sink`` (the relay) as bytes, with any
bytes that came in behind the first frame handed over first.

The first frame is held to what the relay holds every later one to (``frames``): one
whole message of the protocol's kind (binary for Kyutai's, text for OpenAI's) within
the size limit, unmasked, judged from its header before its
payload is read, in a buffer that grows in place; a hostile pod that declares a huge
frame is refused at once and costs the router nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import cast

from websockets import client as ws_client
from websockets import uri as ws_uri
from websockets.http11 import Response

from asrpool.router import frames

CLOSE_TIMEOUT_S = 2.0  # for the pod's answer to a clean close, as the websockets client


class HandshakeFailed(Exception):
    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.status = status  # the pod's HTTP status, when it refused the upgrade


def _status(head: bytes) -> int | None:
    """The status code of a response head (its body, if any, may not be here yet)."""
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


class PodLink(asyncio.Protocol):
    """One pod connection. Before :meth:`attach`, reading stops after the first frame."""

    def __init__(self, uri: str, headers: dict[str, str], max_bytes: int,
                 opcode: int = frames.BINARY) -> None:
        self.handshake = ws_client.ClientProtocol(ws_uri.parse_uri(uri), max_size=max_bytes)
        self.request = self.handshake.connect()
        self.request.headers.update(headers)
        self.response: Response | None = None
        self.first: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.lost = asyncio.get_running_loop().create_future()  # set with the exception
        self.max_bytes = max_bytes
        self.opcode = opcode  # of the first frame
        self.buffer = bytearray()
        self.sink: Callable[[bytes], None] | None = None
        self.transport: asyncio.Transport | None = None
        self.on_lost: Callable[[], None] | None = None
        self.on_pause: Callable[[bool], None] | None = None
        # Whether a frame of the router's own may go to the pod now (the relay's
        # client-to-pod flow is at a frame boundary); always before the relay.
        self.at_boundary: Callable[[], bool] = lambda: True

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.handshake.send_request(self.request)
        self.transport.write(b"".join(self.handshake.data_to_send()))

    def data_received(self, data: bytes) -> None:
        if self.sink is not None:
            self.sink(data)
            return
        self.buffer += data
        if self.response is None:
            self._read_response()
        if self.response is not None and not self.first.done():
            self._read_first_frame()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.first.done():
            self.first.set_exception(HandshakeFailed(f"connection lost: {exc}"))
        if not self.lost.done():
            self.lost.set_result(exc)
        if self.on_lost is not None:
            self.on_lost()

    def pause_writing(self) -> None:
        if self.on_pause is not None:
            self.on_pause(True)

    def resume_writing(self) -> None:
        if self.on_pause is not None:
            self.on_pause(False)

    # handshake

    def _read_response(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > 65536:
                self._fail("response headers too long")
            return
        head = bytes(self.buffer[: end + 4])
        del self.buffer[: end + 4]
        self.handshake.receive_data(head)
        events = self.handshake.events_received()
        if self.handshake.handshake_exc is not None or not events:
            self._fail(f"handshake refused: {self.handshake.handshake_exc or head[:80]!r}",
                       _status(head))
            return
        self.response = cast(Response, events[0])

    def _read_first_frame(self) -> None:
        got = frames.header(self.buffer)
        if got is None:
            return
        first, opcode, head, size, masked = got
        refused = _first_frame_fault(first, opcode, size, masked, self.max_bytes, self.opcode)
        if refused:
            self._fail(refused)
            return
        if len(self.buffer) < head + size:
            return
        payload = bytes(self.buffer[head : head + size])
        del self.buffer[: head + size]
        assert self.transport is not None
        self.transport.pause_reading()  # until the relay takes over
        self.first.set_result(payload)

    def _fail(self, reason: str, status: int | None = None) -> None:
        if not self.first.done():
            self.first.set_exception(HandshakeFailed(reason, status))
        self.abort()

    # after the first frame

    def attach(self, sink: Callable[[bytes], None]) -> None:
        """Send everything the pod sends from now on (and what came early) to ``sink``."""
        self.sink = sink
        early, self.buffer = bytes(self.buffer), bytearray()
        if early:
            sink(early)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def abort(self) -> None:
        """Drop the connection without a close frame (the pod reads it as lost)."""
        if self.transport is not None:
            self.transport.abort()

    async def close(self, code: int = 1000) -> bool:
        """A clean close (the pod frees the slot), waiting a bound for the pod's answer;
        whether it came. Without it, without a frame boundary to put the close frame at,
        or with bytes the pod has not taken yet, the link is dropped, which the pod reads
        as a lost connection (the caller then asks the pod to end the stream)."""
        if self.transport is None or self.transport.is_closing():
            return True
        if not self.at_boundary() or self.transport.get_write_buffer_size():
            # Cut mid-frame, or the pod is not reading (it holds back audio sent before):
            # it would read the close too late, if ever; the caller asks for the end.
            self.abort()
            return False
        self.sink = _discard
        self.transport.write(frames.close_frame(code, mask=os.urandom(4)))
        with contextlib.suppress(Exception):
            self.transport.resume_reading()
        try:
            await asyncio.wait_for(asyncio.shield(self.lost), CLOSE_TIMEOUT_S)
        except TimeoutError:
            self.abort()
            return False
        return True


def _first_frame_fault(first: int, opcode: int, size: int, masked: int,
                       max_bytes: int, expected: int) -> str:
    """Why a pod's first frame (``Ready`` or an ``Error``) is refused, from its header."""
    if opcode != expected or first & 0x70 or not first & 0x80:
        kind = "binary" if expected == frames.BINARY else "text"
        return f"first frame is not one whole {kind} message (header byte {first:#04x})"
    if masked:
        return "first frame is masked (no server masks its frames)"
    if size > max_bytes:
        return f"first frame declares {size} bytes, over the {max_bytes}-byte limit"
    return ""


def _discard(_: bytes) -> None:
    pass


async def dial(
    address: str, path: str, headers: dict[str, str], max_bytes: int, timeout: float,
    opcode: int = frames.BINARY,
) -> tuple[PodLink, bytes]:
    """Connect, upgrade, read the first frame; raises OSError, TimeoutError or
    :class:`HandshakeFailed`."""
    loop = asyncio.get_running_loop()
    host, _, port = address.rpartition(":")
    uri = f"ws://{address}{path}"
    async with asyncio.timeout(timeout):
        _, link = await loop.create_connection(
            lambda: PodLink(uri, headers, max_bytes, opcode), host.strip("[]"), int(port)
        )
        try:
            first = await link.first
        except BaseException:
            link.abort()
            raise
    return link, first
