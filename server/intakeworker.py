"""An intake process: the per-message work of websocket streams, off the pod's event loop.

With ``--intake-workers N`` a pod accepts each stream's websocket as ever (the upgrade,
the key, the slot), then hands the connection's socket to one of N intake processes
(:mod:`asrpool.server.intake`). Here, for every message of the stream, it

- parses the client's frames (moshi-server's frame limit and liveness, as
  :class:`framing.WebSocketProtocol` has them on the pod's own loop);
- decodes and checks each message, and spends the connection's message budget;
- forwards checked ``Audio`` samples, ``Marker`` and ``Init`` to the pod, and any other
  message as it came (``SLOW``: OggOpus, which the pod decodes as ever);
- holds the client back while the stream's slot is full (the pod writes each slot's
  samples taken by the engine into shared memory; a ``TICK`` after each step says
  to look again) and while a ``SLOW`` message waits for the pod's ``ACK``;
- writes the step results the pod sends it, and the pod's last ``Error`` and close;
- ends the stream with the refusal the pod would have made (``FAULT``), or says that
  the client left (``GONE``).

The pod keeps the stream, its slot, control and the heartbeat: a stream's whole life
but its messages. The process exits when the pod closes its end of the socket pair.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import mmap
import os
import socket
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray
from websockets import frames
from websockets import protocol as ws_protocol

from asrpool.common import framing, protocol
from asrpool.server import budgets, inputs, intakewire, outcomes

_RECEIVE_BYTES = 1 << 20
_AUDIO_CHUNK = 8192  # samples per AUDIO record (32 KiB)
_SLOW_CHUNK = 32 << 10  # bytes per SLOW record
_CLOSE_WAIT_S = 10.0  # for the client's answer to our close, as uvicorn
_LOOK_AGAIN_S = 1.0  # at an idle stream the pod holds back
Message = tuple[str, Any]  # ("binary" | "text", data) or ("close", code) or ("refused", reason)


class Limits:
    """The pod's per-stream settings, as ``serve`` has them (passed as JSON)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.max_bytes = int(settings["max_message_bytes"])
        self.rate = float(settings["max_messages_per_second"])
        self.burst = float(settings["message_burst"])
        self.cap = int(settings["max_buffer_samples"])
        self.idle_seconds = float(settings["idle_timeout_seconds"])
        self.ping_interval = float(settings["ping_interval_seconds"])
        self.ping_timeout = float(settings["ping_timeout_seconds"])
        self.send_timeout = float(settings["send_timeout_seconds"])
        self.max_pending = int(settings["max_pending_messages"])


class Connection(asyncio.Protocol):
    """One stream's websocket, handed over right after its accept."""

    def __init__(self, intake: Intake, conn: int, opening: intakewire.Opening) -> None:
        self.intake, self.id, self.slot = intake, conn, opening.slot
        self.limits = limits = intake.limits
        self.loop = intake.loop
        self.received = opening.received  # samples of the stream sent to the pod, in all
        self.input = inputs.StreamInput(kind=opening.kind)  # its kind of audio, once fixed
        self.ws = framing.RefusingConnection(limits.max_bytes, state=ws_protocol.OPEN)
        self.budget = budgets.MessageBudget(limits.rate, limits.burst)
        self.transport: asyncio.Transport | None = None
        self.backlog: collections.deque[Message] = collections.deque()
        self.fragments: list[bytes | bytearray | memoryview] = []
        self.fragment_type = "binary"
        self.waiting: str | None = None  # "room" or "ack": no message is taken meanwhile
        self.over = False  # a FAULT or GONE told: no more messages taken
        self.closing = False  # the pod's END is being done
        self._end_due: tuple[list[bytes], int] | None = None
        self.unsent: list[bytes] = []  # results while the client reads nothing
        self.writing_paused = False
        self.heard = True  # anything from the client since the last ping
        self.last_message = self.loop.time()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.send(opening.first)

    # The transport.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        framing.bound_unsent(transport)
        self._write(self.unsent)
        self.unsent = []
        self._later("ping", self.limits.ping_interval, self._ping)
        self._later("idle", self.limits.idle_seconds, self._idle_check)
        if self._end_due is not None:  # ended by the pod before the socket was here
            self.end(*self._end_due)
        elif self.waiting is not None:
            transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        self.heard = True
        self.ws.receive_data(data)
        if self.closing or self.over:
            self._after_end()
            return
        self._parse()
        self._flush_ws()
        self._take()

    def eof_received(self) -> bool | None:
        self.ws.receive_eof()
        if not self.over and not self.closing:
            self._parse()
            self._take()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self.intake.forget(self)
        if not self.over and not self.closing:
            # A close parsed while the messages before it were held back (the closing
            # handshake ends the connection at once, as uvicorn's): a clean end all the
            # same; those messages are not taken.
            received = self.ws.close_rcvd
            self._tell_gone(protocol.CloseCode.LOST if received is None else received.code)
        if not self.closing:  # an END was answered already
            self.intake.send(intakewire.record(intakewire.CLOSED, self.id))

    def pause_writing(self) -> None:
        self.writing_paused = True
        self._later("stall", self.limits.send_timeout, self._send_late)

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._cancel("stall")
        unsent, self.unsent = self.unsent, []
        self._write(unsent)

    # The client's frames, in order, as whole messages.

    def _parse(self) -> None:
        while True:
            for event in self.ws.events_received():
                if isinstance(event, frames.Frame):
                    self._frame(event)
            refused = self.ws.refused
            if refused is None or self.ws.parser_exc is not refused:
                break
            self.ws.parser_exc = None  # refused, not failed: parsing goes on behind it
            self.fragments = []
            if self.ws.state is ws_protocol.OPEN:
                reason = framing.refusal_reason(refused, self.ws.max_bytes)
                self.backlog.append(("refused", reason))
            self.ws.receive_data(b"")  # the bytes behind the frame's header
        if self.ws.parser_exc is not None:  # a frame a server must refuse: closed
            sent = self.ws.close_sent
            self.backlog.append(("close", sent.code if sent else protocol.CloseCode.LOST))

    def _frame(self, frame: frames.Frame) -> None:
        opcode = frame.opcode
        if opcode in (frames.Opcode.TEXT, frames.Opcode.BINARY):
            kind = "binary" if opcode is frames.Opcode.BINARY else "text"
            if frame.fin:
                self.backlog.append((kind, frame.data))
            else:
                self.fragments, self.fragment_type = [frame.data], kind
        elif opcode is frames.Opcode.CONT:
            if frame.fin and protocol.decode_router_refusal(frame.data) is not None:
                self.fragments = []  # a router's refusal stands for the whole message
            self.fragments.append(frame.data)
            if frame.fin:
                self.backlog.append((self.fragment_type, b"".join(self.fragments)))
                self.fragments = []
        elif opcode is frames.Opcode.CLOSE:
            received = self.ws.close_rcvd
            self.backlog.append(("close", received.code if received else
                                 protocol.CloseCode.NO_STATUS))

    def _take(self) -> None:
        """Messages to the pod while its slot has room (each waits for room first, as
        the pod's own reader does)."""
        while self.backlog and self.waiting is None and not self.over:
            if self.buffered() >= self.limits.cap:
                self._wait("room")
                return
            self._message(*self.backlog.popleft())
        if self.waiting is None and self.transport is not None and not self.over:
            self.transport.resume_reading()

    def buffered(self) -> int:
        """Samples of the slot not taken by the engine yet (those on their way count)."""
        return self.received - int(self.intake.taken[self.slot])

    def _wait(self, why: str) -> None:
        self.waiting = why
        if why == "room":
            self.intake.waiting_room.add(self)
        if self.transport is not None:
            self.transport.pause_reading()

    def go_on(self, why: str) -> None:
        """A step went by (``room``) or the pod took a slow message (``ack``)."""
        if self.waiting == why and (why != "room" or self.buffered() < self.limits.cap):
            self.waiting = None
            self.intake.waiting_room.discard(self)
            self._take()

    def _message(self, kind: str, data: Any) -> None:
        if kind == "close":
            self._tell_gone(int(data))
        elif kind == "refused":
            self._fault(protocol.Refusal(data, protocol.ErrorCode.TOO_LARGE,
                                         protocol.CloseCode.TOO_LARGE))
        elif kind == "text":  # ignored, and no activity, as in moshi-server
            if not self.budget.spend(0):
                self._fault(outcomes.over_budget(self.limits.rate))
        else:
            self.last_message = self.loop.time()
            self._binary(data)

    def _binary(self, data: bytes) -> None:
        try:
            decoded = protocol.decode_client(data, self.limits.max_bytes)
            if not self.budget.spend(budgets.samples_of(decoded)):
                self._fault(outcomes.over_budget(self.limits.rate))
                return
            self._forward(decoded, data)
        except protocol.ProtocolError as exc:
            self._fault(outcomes.refused_message(exc, data))

    def _forward(self, decoded: protocol.ClientMessage, data: bytes) -> None:
        if decoded["type"] == "Audio":
            self.input.claim("Audio")
            self._audio(decoded["pcm"])
        elif decoded["type"] == "Marker":
            self.intake.send(intakewire.record(
                intakewire.MARKER, self.id, intakewire.MARKER_ID.pack(decoded["id"])))
        elif decoded["type"] == "Init":
            self.intake.send(intakewire.record(intakewire.INIT, self.id))
        else:  # OggOpus: the pod decodes it (its lanes, or its loop) and says when done
            self.input.claim("OggOpus")
            for at in range(0, max(len(data), 1), _SLOW_CHUNK):
                last = at + _SLOW_CHUNK >= len(data)
                self.intake.send(intakewire.record(
                    intakewire.SLOW if last else intakewire.SLOW_PART, self.id,
                    data[at:at + _SLOW_CHUNK]))
            self._wait("ack")

    def _audio(self, pcm: NDArray[np.float32]) -> None:
        samples = np.ascontiguousarray(pcm, dtype=np.float32)
        for at in range(0, len(samples), _AUDIO_CHUNK):
            chunk = samples[at:at + _AUDIO_CHUNK]
            self.intake.send(intakewire.record(intakewire.AUDIO, self.id, chunk.tobytes()))
        self.received += len(samples)

    # Ends.

    def _fault(self, refusal: protocol.Refusal) -> None:
        self.over = True
        self.intake.send(intakewire.record(intakewire.FAULT, self.id,
                                           intakewire.pack_refusal(refusal)))
        if self.transport is not None:
            self.transport.pause_reading()

    def _tell_gone(self, code: int) -> None:
        self.over = True
        self.intake.send(intakewire.record(intakewire.GONE, self.id,
                                           intakewire.CLOSE_CODE.pack(code)))
        self._flush_ws()  # the answer to the client's close, and the connection's end

    def end(self, last: list[bytes], close_code: int) -> None:
        """The pod ends the stream: its last messages (results, an ``Error``), then a
        close; the client's answer is waited for a while, then the connection closes."""
        if self.transport is None:  # not connected yet: ended once it is
            self._end_due = (last, close_code)
            return
        self.closing = True
        if self.transport.is_closing():
            self.intake.send(intakewire.record(intakewire.CLOSED, self.id))
            return
        self.send(last)
        if self.ws.state is ws_protocol.OPEN:
            self.ws.send_close(close_code)
        self._flush_ws()
        self.intake.send(intakewire.record(intakewire.CLOSED, self.id))  # the pod may go on
        if not self.transport.is_closing():
            self.transport.resume_reading()  # for the client's close
            self._later("close", _CLOSE_WAIT_S, self._close_now)

    def _after_end(self) -> None:
        """Bytes after the stream's end: only a close (or the end of the stream) counts."""
        self.ws.events_received()
        self._flush_ws()

    def _close_now(self) -> None:
        """No answer to our close: closed anyway (what is written still goes out; a
        client that reads nothing meets the send deadline)."""
        if self.transport is not None:
            self.transport.close()

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # Results to the client.

    def send(self, messages: list[bytes]) -> None:
        if self.transport is None or self.writing_paused:
            self.unsent.extend(messages)
            if len(self.unsent) > self.limits.max_pending and not self.over:
                self._fault(protocol.Refusal(
                    "too many results waiting: the client does not read them",
                    protocol.ErrorCode.TOO_SLOW))
            return
        self._write(messages)

    def _write(self, messages: list[bytes]) -> None:
        if self.ws.state is not ws_protocol.OPEN or self.transport is None:
            return
        for message in messages:
            self.ws.send_binary(message)
        self._flush_ws()

    def _flush_ws(self) -> None:
        """What the websocket protocol has to send; its end of the stream (an empty
        chunk: the closing handshake is done) closes the connection."""
        data = self.ws.data_to_send()
        if not data or self.transport is None or self.transport.is_closing():
            return
        self.transport.write(b"".join(data))
        if data[-1] == b"":
            self.transport.close()

    def _send_late(self) -> None:
        """The client read nothing for the send deadline: aborted, its stream too_slow."""
        self._timers.pop("stall", None)
        if not self.over:
            self._fault(outcomes.too_slow(self.limits.send_timeout))
        self._abort()

    # Timers: liveness and idleness.

    def _later(self, name: str, seconds: float, callback: Any) -> None:
        self._cancel(name)
        self._timers[name] = self.loop.call_later(seconds, callback)

    def _cancel(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    def _ping(self) -> None:
        """A ping an interval after the last one was answered (or its timeout passed
        while the client was held back); a client from which nothing came within the
        timeout of a ping is dropped, unless it is held back (then its bytes wait
        because of us)."""
        self._timers.pop("ping", None)
        if self.ws.state is not ws_protocol.OPEN or self.closing:
            return
        self.heard = False
        self.ws.send_ping(b"")
        self._flush_ws()
        self._later("pong", self.limits.ping_timeout, self._pong_check)

    def _pong_check(self) -> None:
        self._timers.pop("pong", None)
        if self.over or self.closing:
            return
        if not self.heard and self.waiting is None:
            self._abort()  # a close would wait for a buffer the client never reads
            return
        self._later("ping", self.limits.ping_interval, self._ping)

    def _idle_check(self) -> None:
        """No binary message for the idle timeout while this process waits for one and
        the engine has none of the stream's audio: the stream ends (as
        :class:`idleness.IdleWatch` on the pod's own loop)."""
        if self.over or self.closing:
            return
        now = self.loop.time()
        due = self.last_message + self.limits.idle_seconds
        if now < due:
            self._later("idle", due - now, self._idle_check)
        elif self.waiting is not None or self.buffered() >= protocol.FRAME_SIZE:
            self._later("idle", _LOOK_AGAIN_S, self._idle_check)
        else:
            self._fault(outcomes.idle(self.limits.idle_seconds))


class Intake:
    """The connections of one intake process and its socket to the pod."""

    def __init__(self, loop: asyncio.AbstractEventLoop, channel: socket.socket,
                 taken: NDArray[np.int64], limits: Limits) -> None:
        self.loop, self.channel, self.taken, self.limits = loop, channel, taken, limits
        self.connections: dict[int, Connection] = {}
        self.waiting_room: set[Connection] = set()  # held back for their slot's room
        self.done = loop.create_future()
        self._outbox = intakewire.Outbox(channel)
        self._flushing = False
        self._partial: dict[int, bytearray] = {}
        channel.setblocking(False)
        loop.add_reader(channel, self._readable)

    def send(self, parts: list[bytes | memoryview]) -> None:
        self._outbox.add(parts)
        if not self._flushing:
            self._flushing = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        if not self._outbox.flush():
            self.loop.add_writer(self.channel, self._writable)

    def _writable(self) -> None:
        if self._outbox.flush():
            self.loop.remove_writer(self.channel)

    def forget(self, connection: Connection) -> None:
        self.waiting_room.discard(connection)
        if self.connections.get(connection.id) is connection:
            del self.connections[connection.id]

    def _readable(self) -> None:
        for _ in range(64):  # then let the connections' reads in
            try:
                data, fds, _, _ = socket.recv_fds(self.channel, _RECEIVE_BYTES, 1)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if not data:
                self._stop()
                return
            for kind, conn, payload in intakewire.records(data):
                self._record(kind, conn, payload, fds)

    def _record(self, kind: int, conn: int, payload: memoryview, fds: list[int]) -> None:
        if kind == intakewire.OPEN:
            self._open(conn, intakewire.Opening.unpack(payload), fds.pop(0))
            return
        if kind == intakewire.TICK:
            for connection in list(self.waiting_room):
                connection.go_on("room")
            return
        found = self.connections.get(conn)
        if kind == intakewire.END:
            if found is None:
                self.send(intakewire.record(intakewire.CLOSED, conn))
            else:
                found.end(*intakewire.unpack_end(payload))
        elif found is not None and kind == intakewire.SEND:
            found.send([bytes(payload)])
        elif found is not None and kind == intakewire.ACK:
            found.go_on("ack")

    def _open(self, conn: int, opening: intakewire.Opening, fd: int) -> None:
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        connection = Connection(self, conn, opening)
        self.connections[conn] = connection
        self.loop.create_task(self._connect(connection, sock))

    async def _connect(self, connection: Connection, sock: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: connection, sock)
        except OSError:
            sock.close()
            connection.connection_lost(None)

    def _stop(self) -> None:
        self.loop.remove_reader(self.channel)
        for connection in list(self.connections.values()):
            if connection.transport is not None:
                connection.transport.abort()
        if not self.done.done():
            self.done.set_result(None)


def _taken(fd: int, slots: int) -> NDArray[np.int64]:
    view = mmap.mmap(fd, slots * 8)
    os.close(fd)
    return np.frombuffer(view, dtype=np.int64)


async def serve(channel_fd: int, taken_fd: int, slots: int, settings: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    channel = socket.socket(fileno=channel_fd)
    intake = Intake(loop, channel, _taken(taken_fd, slots), Limits(settings))
    await intake.done


def main() -> int:
    parser = argparse.ArgumentParser(prog="asrpool-intake")
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--taken-fd", type=int, required=True)
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--settings", required=True, help="the pod's limits, as JSON")
    args = parser.parse_args()
    coroutine = serve(args.channel_fd, args.taken_fd, args.slots, json.loads(args.settings))
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        asyncio.run(coroutine)
    else:
        uvloop.run(coroutine)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
