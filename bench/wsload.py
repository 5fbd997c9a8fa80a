"""A websocket backend and load generator cheap enough not to be what a proxy benchmark measures.

Both speak just enough RFC 6455 on raw asyncio protocols (uvloop): the backend
answers the upgrade, sends a ``Ready`` and answers each binary message with a 40-byte
one; the generator opens N real-time streams (one 9.6 KB ``Audio`` message every 80 ms
each) and times every reply against its message. Payloads are never unmasked: their
content does not matter here, only their framing.

    python -m asrpool.bench.wsload backend --port P     # serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import hashlib
import os
import struct
import time
from typing import cast

import msgpack

from asrpool.common import protocol

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
AUDIO = msgpack.packb({"type": "Audio", "pcm": [0.0] * protocol.FRAME_SIZE}, use_single_float=True)
READY = msgpack.packb({"type": "Ready"})
REPLY = msgpack.packb({"type": "Word", "text": "xxx", "start_time": 1.0})
assert len(REPLY) == 40


def frame(payload: bytes, opcode: int = 2, mask: bytes | None = None) -> bytes:
    """One final frame; masked with ``mask`` (a client's) when given."""
    size = len(payload)
    bit = 0x80 if mask is not None else 0
    if size < 126:
        head = struct.pack("!BB", 0x80 | opcode, bit | size)
    elif size < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, bit | 126, size)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, bit | 127, size)
    if mask is None:
        return head + payload
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + body


CLIENT_CLOSE = frame(b"\x03\xe8", 8, b"\0\0\0\0")  # a client's close 1000


def parse(buf: bytearray) -> tuple[int, int, int] | None:
    """(opcode, payload start, frame end) of the first whole frame in ``buf``, or None."""
    if len(buf) < 2:
        return None
    size, start = buf[1] & 0x7F, 2
    if size == 126:
        if len(buf) < 4:
            return None
        size, start = struct.unpack_from("!H", buf, 2)[0], 4
    elif size == 127:
        if len(buf) < 10:
            return None
        size, start = struct.unpack_from("!Q", buf, 2)[0], 10
    if buf[1] & 0x80:
        start += 4
    end = start + size
    return (buf[0] & 0x0F, start, end) if len(buf) >= end else None


def accept_key(key: bytes) -> bytes:
    return base64.b64encode(hashlib.sha1(key + GUID).digest())


class Backend(asyncio.Protocol):
    """The pod's part: upgrade, ``Ready``, a 40-byte answer to every binary message."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.buf, self.open = bytearray(), False

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.open and not self._upgrade():
            return
        while (got := parse(self.buf)) is not None:
            opcode, _, end = got
            if opcode == 2:
                self.transport.write(frame(REPLY))
            elif opcode == 8:
                self.transport.write(frame(b"\x03\xe8", 8))
                self.transport.close()
            elif opcode == 9:
                self.transport.write(frame(b"", 10))
            del self.buf[:end]

    def _upgrade(self) -> bool:
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return False
        head = bytes(self.buf[:head_end]).decode("latin-1")
        key = next(line.split(":", 1)[1].strip() for line in head.split("\r\n")
                   if line.lower().startswith("sec-websocket-key:"))
        self.transport.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                             b"Connection: Upgrade\r\nSec-WebSocket-Accept: "
                             + accept_key(key.encode()) + b"\r\n\r\n" + frame(READY))
        del self.buf[:head_end + 4]
        self.open = True
        return True


class Stream(asyncio.Protocol):
    """One client stream: upgrade, wait for ``Ready``, then time each reply."""

    def __init__(self, path: str, host: str, rtts: list[float]) -> None:
        self.key = base64.b64encode(os.urandom(16))
        self.request = (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                        f"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                        f"Sec-WebSocket-Key: {self.key.decode()}\r\n\r\n").encode()
        self.rtts, self.sent = rtts, collections.deque[float]()
        self.buf, self.upgraded = bytearray(), False
        self.ready, self.closed = asyncio.Event(), asyncio.Event()
        self.replied = asyncio.Event()  # a reply to a message of ours came
        self.first = b""  # the first binary message: READY, or the router's Error

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()
        self.ready.set()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.upgraded:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            if not self.buf.startswith(b"HTTP/1.1 101"):
                self.transport.close()
                return
            del self.buf[:head_end + 4]
            self.upgraded = True
        while (got := parse(self.buf)) is not None:
            self._frame(got[0], bytes(self.buf[got[1]:got[2]]))
            del self.buf[:got[2]]

    def _frame(self, opcode: int, payload: bytes) -> None:
        if opcode == 9:
            self.transport.write(frame(payload, 10, b"\0\0\0\0"))
        elif opcode == 8:
            self.transport.close()
        elif opcode == 2 and not self.ready.is_set():
            self.first = payload
            self.ready.set()
        elif opcode == 2 and self.sent:
            self.rtts.append(time.perf_counter() - self.sent.popleft())
            self.replied.set()

    def send(self, message: bytes) -> None:
        self.sent.append(time.perf_counter())
        self.transport.write(message)


async def one_stream(host: str, port: int, path: str, seconds: float, offset: float,
                     rtts: list[float], refused: list[bytes]) -> int:
    """One real-time stream; the number of messages sent (0 if it got no ``Ready``: the
    first message it got instead goes into ``refused``)."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(offset)
    _, stream = await loop.create_connection(lambda: Stream(path, host, rtts), host, port)
    await asyncio.wait_for(stream.ready.wait(), 30)
    if stream.first != READY:
        refused.append(stream.first[:200])
        stream.transport.close()
        return 0
    message = frame(AUDIO, 2, os.urandom(4))
    start, count = loop.time(), int(seconds * protocol.FRAME_RATE)
    for k in range(count):
        await asyncio.sleep(max(0.0, start + k / protocol.FRAME_RATE - loop.time()))
        if stream.closed.is_set():
            return k
        stream.send(message)
    await asyncio.sleep(1.0)  # the last replies
    stream.transport.write(CLIENT_CLOSE)
    try:
        await asyncio.wait_for(stream.closed.wait(), 5)
    except TimeoutError:
        stream.transport.abort()
    return count


async def run_streams(host: str, port: int, path: str, count: int, seconds: float,
                      rtts: list[float]) -> dict[str, object]:
    spread = 1.0 / protocol.FRAME_RATE
    refused: list[bytes] = []
    results = await asyncio.gather(
        *(one_stream(host, port, path, seconds, spread * i / count, rtts, refused)
          for i in range(count)),
        return_exceptions=True)
    sent = sum(r for r in results if isinstance(r, int))
    reasons = collections.Counter(_reason(m) for m in refused)
    return {"streams": count, "messages_sent": sent, "replies": len(rtts),
            "refused": dict(reasons),
            "failed": [repr(r) for r in results if isinstance(r, BaseException)][:3]}


async def open_and_close(host: str, port: int, path: str) -> None:
    """One short stream: upgrade, ``Ready``, one message and its reply, a clean close."""
    loop = asyncio.get_running_loop()
    _, stream = await loop.create_connection(lambda: Stream(path, host, []), host, port)
    await asyncio.wait_for(stream.ready.wait(), 30)
    if stream.first != READY:
        raise RuntimeError(f"refused: {_reason(stream.first)}")
    stream.send(frame(AUDIO, 2, os.urandom(4)))
    await asyncio.wait_for(stream.replied.wait(), 30)
    stream.transport.write(CLIENT_CLOSE)
    await asyncio.wait_for(stream.closed.wait(), 5)


async def churn(host: str, port: int, path: str, count: int, at_once: int) -> None:
    """``count`` short streams (:func:`open_and_close`), ``at_once`` at a time."""
    gate = asyncio.Semaphore(at_once)

    async def one() -> None:
        async with gate:
            await open_and_close(host, port, path)

    await asyncio.gather(*(one() for _ in range(count)))


def _reason(message: bytes) -> str:
    try:
        return str(msgpack.unpackb(message).get("code") or "no Ready")
    except (ValueError, AttributeError, msgpack.UnpackException):
        return "no Ready"


async def serve_backend(host: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Backend, host, port, backlog=2048)
    async with server:
        await server.serve_forever()


def main() -> None:
    import uvloop

    parser = argparse.ArgumentParser(prog="python -m asrpool.bench.wsload")
    parser.add_argument("role", choices=["backend"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    opts = parser.parse_args()
    uvloop.run(serve_backend(opts.host, opts.port))


if __name__ == "__main__":
    main()
