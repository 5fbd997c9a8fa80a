"""The pod's websocket parser (``framing.RefusingConnection``, sans-I/O) refuses a message
over the limit from a frame's header, one frame or the fragment that takes a fragmented
message over it, and discards the rest of that message as it arrives: never buffered,
never a failed connection, whatever the reads, even once the application has closed.

Each test drives the parser as ``framing.WebSocketProtocol`` does: the frames parsed
before a refused one, then the refusal (``REFUSED``), then parsing resumes behind it.
"""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st
from websockets import frames as ws_frames
from websockets import protocol as ws_protocol

from asrpool.common import framing, protocol
from asrpool.router import frames, refusals

MASK = b"\x01\x02\x03\x04"
LIMIT = 1000
REFUSED = "refused"
UPGRADE = (b"GET /api/asr-streaming HTTP/1.1\r\nHost: pod\r\nUpgrade: websocket\r\n"
           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           b"Sec-WebSocket-Version: 13\r\n\r\n")
Cuts = st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=12)


def opened() -> framing.RefusingConnection:
    conn = framing.RefusingConnection(LIMIT)
    conn.receive_data(UPGRADE)
    [request] = conn.events_received()
    conn.send_response(conn.accept(request))
    conn.data_to_send()
    assert conn.state is ws_protocol.OPEN
    return conn


def fragment(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    framed = frames.frame(opcode, payload, MASK)
    return framed if fin else bytes([framed[0] & 0x7F]) + framed[1:]


def fragments(*sizes: int) -> list[bytes]:
    """A fragmented binary message: fragments of these sizes, each under the limit."""
    return [fragment(frames.BINARY if i == 0 else frames.CONT, bytes([i]) * size,
                     i == len(sizes) - 1) for i, size in enumerate(sizes)]


def message(text: bytes) -> bytes:
    return frames.frame(frames.BINARY, text, MASK)


def feed(conn: framing.RefusingConnection, data: bytes, cuts: list[int] | None = None,
         piece: int | None = None) -> tuple[list[object], int]:
    """What the application would see (data and control frames, ``REFUSED``) and the
    most bytes the parser held at once."""
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts or ()), len(data)]
    if piece:
        bounds = [*range(0, len(data), piece), len(data)]
    seen: list[object] = []
    held = 0
    for a, b in itertools.pairwise(bounds):
        conn.receive_data(data[a:b])
        held = max(held, len(conn.reader.buffer))
        seen += taken(conn)
    return seen, held


def taken(conn: framing.RefusingConnection) -> list[object]:
    """The frames parsed; at a refusal, those before it, then it, then parsing on."""
    seen: list[object] = []
    while True:
        seen += [_shown(f) for f in conn.events_received()]
        if conn.parser_exc is None:
            return seen
        assert conn.parser_exc is conn.refused, conn.parser_exc
        conn.parser_exc = None
        seen.append(REFUSED)
        conn.receive_data(b"")  # as the protocol resumes it


def _shown(frame: object) -> object:
    assert isinstance(frame, ws_frames.Frame)
    return (frame.opcode.name, bytes(frame.data)[:8], frame.fin)


@given(Cuts)
def test_a_fragmented_message_over_the_limit_is_refused_and_the_rest_dropped(
        cuts: list[int]) -> None:
    """The message before it, the fragments before the refused one (which the protocol
    drops), the refusal, a ping between the dropped fragments (answered), the message
    after it: the parser goes on as if the refused message had not been sent."""
    conn = opened()
    big = fragments(600, 600, 600, 700, 0)  # refused at the third: 1800 bytes
    ping = frames.frame(frames.PING, b"ping", MASK)
    flow = message(b"before") + b"".join(big[:4]) + ping + big[4] + message(b"after")
    seen, _ = feed(conn, flow, cuts)
    assert seen == [("BINARY", b"before", True), ("BINARY", bytes(600)[:8], False),
                    ("CONT", b"\x01" * 8, False), REFUSED, ("PING", b"ping", True),
                    ("BINARY", b"after", True)]
    assert conn.refused is not None and conn.refused.size == 600
    assert frames.frame(frames.PONG, b"ping") in conn.data_to_send()
    assert conn.state is ws_protocol.OPEN and conn.current_size is None


def test_a_refused_messages_fragments_are_never_held_whole() -> None:
    conn = opened()
    big = fragments(600, *[100_000] * 5)  # refused at the second, from its header
    seen, held = feed(conn, b"".join(big) + message(b"after"), piece=4096)
    assert seen[-2:] == [REFUSED, ("BINARY", b"after", True)]
    assert held < 4096 + 14  # one read and a header: the 100 kB payloads dropped as they come


def test_a_single_frame_over_the_limit_is_refused_alone() -> None:
    conn = opened()
    flow = message(b"before") + message(bytes(LIMIT + 1)) + message(b"after")
    seen, _ = feed(conn, flow, piece=100)
    assert seen == [("BINARY", b"before", True), REFUSED, ("BINARY", b"after", True)]


def test_the_rest_is_dropped_after_the_application_closed() -> None:
    """The application ends the stream (its close sent) while the client still sends
    the refused message, and another over the limit: dropped too, the close awaited."""
    conn = opened()
    big = fragments(600, 600, 600, 600, 600)
    seen, _ = feed(conn, b"".join(big[:3]))
    assert seen[-1] == REFUSED
    conn.send_close(protocol.CloseCode.TOO_LARGE)
    rest = b"".join(big[3:]) + message(bytes(LIMIT + 1)) + frames.close_frame(1009, mask=MASK)
    seen, _ = feed(conn, rest, piece=300)
    assert seen == [REFUSED, ("CLOSE", b"\x03\xf1", True)]  # none for the app: it closed
    assert conn.close_rcvd is not None and conn.close_rcvd.code == 1009


def test_a_close_between_the_dropped_fragments_ends_cleanly() -> None:
    conn = opened()
    big = fragments(600, 600, 600, 600, 600)
    close = frames.close_frame(1000, mask=MASK)
    seen, _ = feed(conn, b"".join(big[:4]) + close)
    assert seen[-2:] == [REFUSED, ("CLOSE", b"\x03\xe8", True)]
    assert conn.close_rcvd is not None and conn.close_rcvd.code == 1000
    assert conn.parser_exc is None  # not the 'incomplete fragmented message' of a failure


def test_a_bad_frame_among_the_dropped_fragments_fails_the_connection() -> None:
    conn = opened()
    big = fragments(600, 600, 600)
    unmasked = frames.frame(frames.CONT, b"x" * 10)
    conn.receive_data(b"".join(big) + unmasked)
    assert conn.parser_exc is conn.refused
    conn.parser_exc = None
    conn.receive_data(b"")
    assert isinstance(conn.parser_exc, Exception) and conn.close_sent is not None
    assert conn.close_sent.code == 1002


def test_a_routers_refusal_fits_the_room_left_for_it() -> None:
    """The parser admits a fragmented message ``ROUTER_REFUSAL_BYTES`` over the limit,
    so that a router's refusal ending one fits; the largest one does."""
    largest = refusals.too_large(2**64 - 1, 2**64 - 1)
    told = protocol.router_refusal(largest)
    assert len(told) <= protocol.ROUTER_REFUSAL_BYTES
    assert protocol.decode_router_refusal(told) == largest


def test_a_routers_refusal_is_only_ever_too_large() -> None:
    """Taken from any link: whoever sends one can end only its own stream, as the
    message over the limit it stands for would."""
    other = protocol.Refusal("drained", protocol.ErrorCode.DRAINING, protocol.CloseCode.RESTART)
    assert protocol.decode_router_refusal(protocol.router_refusal(other)) is None
    assert protocol.decode_router_refusal(b"\x93\x01\x02") is None
