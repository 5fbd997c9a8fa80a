"""The websocket frame limit of pods and routers, and the one way a larger frame ends.

Both run uvicorn's sans-I/O websocket protocol with ``ws_max_size`` equal to their
``max_message_bytes`` (16 MiB by default, as moshi-server's axum). A frame over it is
refused by the parser from its header, before its payload is buffered; plain uvicorn
then closes with 1009 and says nothing. :class:`LimitedFrames` first sends the client
``Error{code:"too_large"}`` naming the sizes, so no client ever sees a silent close.
The application then receives a disconnect with code 1009.
"""

from __future__ import annotations

from uvicorn.protocols.websockets import websockets_sansio_impl
from websockets import exceptions, frames

from asrpool.common import protocol


class LimitedFrames(websockets_sansio_impl.WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol, with an ``Error`` before a 1009 close."""

    def handle_parser_exception(self) -> None:
        exc = self.conn.parser_exc
        if isinstance(exc, exceptions.PayloadTooBig) and exc.message is None:
            error = protocol.error(_reason(exc), "too_large")
            frame = frames.Frame(frames.Opcode.BINARY, error)
            self.transport.write(frame.serialize(mask=False))
        super().handle_parser_exception()


def _reason(exc: exceptions.PayloadTooBig) -> str:
    """The sizes as far as the parser knows them (a compressed frame's size is not)."""
    if exc.size is None:
        return f"message exceeds the limit of {exc.max_size} bytes once decompressed"
    return str(protocol.too_large(exc.size + (exc.current_size or 0), exc.max_size))
