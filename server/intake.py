"""The pod's side of its intake processes (``--intake-workers N``).

A pod's event loop spent some 55 us per stream-step at 1,024 paced streams, most of it
in the websocket layer and the audio decode: more than one loop can give at a GPU's
capacity. With intake processes the loop keeps what is per stream (the upgrade, the
key, the slot, the stream's end, resume, drain, the heartbeat) and hands each
accepted connection's socket to one of N child processes (:mod:`intakeworker`), which
do what is per message: frames, decoding, checks, budgets, idleness, liveness, writing
results. What comes back is batched: checked audio, markers and ``Init`` in order, many
streams' in one datagram, pushed into the slots from one callback; after each step the
stream's results go out the same way, with a ``TICK`` that lets held-back streams read
on (each slot's samples taken are in shared memory: :meth:`slots.SlotBuffers.publish_taken`).

The pod keeps its own copy of every handed-over socket: if an intake process dies, each
of its streams is told with an ``Error`` (internal) written by the pod, and a new process
takes its place for new streams. A connection the pod cannot hand over (a client that
sent frames before the handshake's answer) stays on the pod's own loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
import mmap
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from asrpool.common import framing, protocol
from asrpool.server import handles, intakewire, outcomes, settings, slots

logger = logging.getLogger(__name__)

_RECEIVE_BYTES = 1 << 20
_CLOSE_WAIT_S = 4.0  # for an intake process to send a stream's last messages and close
_FAST = frozenset({intakewire.AUDIO, intakewire.MARKER, intakewire.INIT})
_LOST, _SHUTDOWN = -1, -2  # inbox entries of the pod's own: the process died, uvicorn stops
Entry = tuple[int, bytes]


def limits_of(config: settings.ServerSettings) -> dict[str, Any]:
    """What an intake process needs of the pod's settings."""
    return {
        "max_message_bytes": config.max_message_bytes,
        "max_messages_per_second": config.max_messages_per_second,
        "message_burst": config.message_burst,
        "max_buffer_samples": config.max_buffer_samples,
        "idle_timeout_seconds": config.idle_timeout_seconds,
        "ping_interval_seconds": config.ping_interval_seconds,
        "ping_timeout_seconds": config.ping_timeout_seconds,
        "send_timeout_seconds": config.send_timeout_seconds,
        "max_pending_messages": config.max_pending_messages,
    }


class Remote:
    """A stream's connection while an intake process holds it, as the pod sees it."""

    def __init__(self, conn: int, worker: Worker, handle: handles.Handle,
                 connection: framing.WebSocketProtocol, max_bytes: int) -> None:
        self.conn, self.worker, self.handle = conn, worker, handle
        self.connection = connection  # the pod's own (paused) side of the socket
        self.max_bytes = max_bytes
        self.inbox: collections.deque[Entry] = collections.deque()
        self.wake = asyncio.Event()
        self.closed = asyncio.get_running_loop().create_future()
        self.close_code = protocol.CloseCode.NORMAL
        self._partial = bytearray()

    def send(self, messages: list[bytes]) -> bool:
        """Results of a step, to the client through the intake process."""
        for message in messages:
            self.worker.send_record(intakewire.SEND, self.conn, message)
        return True

    def audio_now(self, payload: memoryview) -> slots.Decoded | None:
        """An ``AUDIO`` record to push at once with others (nothing waits before it)."""
        if self.inbox:
            self.queue(intakewire.AUDIO, bytes(payload))
            return None
        return self.handle.slot, self.handle.generation, self._pcm(payload), 0

    def _pcm(self, payload: memoryview | bytes) -> NDArray[np.float32]:
        """An ``AUDIO`` record's samples (checked by the intake process); the stream's
        first audio fixes its kind."""
        if self.handle.kind() is None:
            self.handle.claim("Audio")
        return np.frombuffer(payload, dtype=np.float32).copy()

    def take(self, kind: int, payload: memoryview) -> None:
        """A record from the intake process, in order: audio, markers and Init at once
        while nothing waits before them, the rest (and what follows) through
        :meth:`read`."""
        if self.inbox or kind not in _FAST:
            self.queue(kind, bytes(payload))
            return
        fault = self._fast(kind, payload)
        if fault is not None:
            self.queue(intakewire.FAULT, intakewire.pack_refusal(fault))

    def queue(self, kind: int, payload: bytes) -> None:
        self.inbox.append((kind, payload))
        self.wake.set()

    def _fast(self, kind: int, payload: memoryview | bytes) -> outcomes.Failed | None:
        if kind == intakewire.AUDIO:
            self.handle.push_audio(self._pcm(payload))
        elif kind == intakewire.MARKER:
            try:
                self.handle.push_marker(intakewire.MARKER_ID.unpack(payload)[0])
            except protocol.ProtocolError as exc:
                return outcomes.client_fault(exc)
        else:
            self.handle.restart()
        return None

    async def read(self) -> outcomes.Outcome:
        """What ends the connection, as the pod's own reader would have it, after
        taking every slow message (OggOpus, each acknowledged once taken)."""
        while True:
            while not self.inbox:
                self.wake.clear()
                await self.wake.wait()
            kind, payload = self.inbox.popleft()
            outcome = await self._slow(kind, payload)
            if outcome is not None:
                return outcome

    async def _slow(self, kind: int, payload: bytes) -> outcomes.Outcome | None:
        if kind in _FAST:
            return self._fast(kind, payload)
        if kind == intakewire.SLOW_PART:
            self._partial += payload
        elif kind == intakewire.SLOW:
            data, self._partial = bytes(self._partial + payload), bytearray()
            try:
                message = protocol.decode_client(data, self.max_bytes)
                await self.handle.room()
                await self.handle.push(message)
            except protocol.ProtocolError as exc:
                return outcomes.refused_message(exc, data)
            self.worker.send(intakewire.record(intakewire.ACK, self.conn))
        elif kind == intakewire.FAULT:
            return intakewire.unpack_refusal(payload)
        elif kind == intakewire.GONE:
            return outcomes.disconnected(intakewire.CLOSE_CODE.unpack(payload)[0])
        elif kind == _LOST:
            return outcomes.Failed("the pod's intake process for this stream ended; connect "
                                   "again", protocol.ErrorCode.INTERNAL,
                                   protocol.CloseCode.INTERNAL)
        elif kind == _SHUTDOWN:
            self.close_code = protocol.CloseCode.RESTART
            return outcomes.Closed()
        return None

    async def end(self, last: list[bytes], close_code: int) -> None:
        """Send the last messages and close, through the intake process (or, if it
        died, from the pod's own side of the socket); return once closed."""
        if self.worker.dead:
            self._end_here(last, close_code)
            return
        if not self.closed.done():
            self.worker.send(intakewire.record(intakewire.END, self.conn,
                                               intakewire.end_payload(last, close_code)))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.closed), _CLOSE_WAIT_S)
        if self.worker.dead and not self.closed.done():
            self._end_here(last, close_code)

    def _end_here(self, last: list[bytes], close_code: int) -> None:
        conn = self.connection.conn
        with contextlib.suppress(Exception):  # whatever state the connection was left in
            for message in last:
                conn.send_binary(message)
            conn.send_close(close_code)
            self.connection.transport.write(b"".join(conn.data_to_send()))

    def lost(self) -> None:
        """Its intake process died."""
        self.queue(_LOST, b"")


class Worker:
    """One intake process and the pod's end of its socket pair."""

    def __init__(self, index: int, taken_fd: int, buffers: slots.SlotBuffers,
                 limits: dict[str, Any], loop: asyncio.AbstractEventLoop,
                 on_dead: Callable[[Worker], None]) -> None:
        self.index = index
        self.buffers = buffers
        self.loop = loop
        self.dead = False
        self.remotes: dict[int, Remote] = {}
        self._on_dead = on_dead
        ours, theirs = intakewire.pair()
        self.process = subprocess.Popen(
            # -P: the working directory is not put on sys.path (a checkout's operator/).
            [sys.executable, "-P", "-m", "asrpool.server.intakeworker",
             "--channel-fd", str(theirs.fileno()), "--taken-fd", str(taken_fd),
             "--slots", str(buffers.total), "--settings", json.dumps(limits)],
            pass_fds=(theirs.fileno(), taken_fd))
        theirs.close()
        ours.setblocking(False)
        self.sock = ours
        self._outbox = intakewire.Outbox(ours)
        self._flushing = False
        self._buffer = bytearray(_RECEIVE_BYTES)
        loop.add_reader(ours, self._readable)

    def open(self, remote: Remote, fd: int, opening: intakewire.Opening) -> None:
        self.remotes[remote.conn] = remote
        self._outbox.add_socket(intakewire.record(intakewire.OPEN, remote.conn, opening.pack()),
                                fd)
        self._soon()

    def send(self, parts: list[bytes | memoryview]) -> None:
        if self.dead:
            return
        self._outbox.add(parts)
        self._soon()

    def send_record(self, kind: int, conn: int, payload: bytes | memoryview = b"") -> None:
        if self.dead:
            return
        self._outbox.add_record(kind, conn, payload)
        if not self._flushing:
            self._soon()

    def forget(self, remote: Remote) -> None:
        if self.remotes.get(remote.conn) is remote:
            del self.remotes[remote.conn]

    def _soon(self) -> None:
        if not self._flushing:
            self._flushing = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        if self.dead:
            return
        try:
            if not self._outbox.flush():
                self.loop.add_writer(self.sock, self._writable)
        except OSError:
            self._died()

    def _writable(self) -> None:
        try:
            if self._outbox.flush():
                self.loop.remove_writer(self.sock)
        except OSError:
            self._died()

    def _readable(self) -> None:
        view = memoryview(self._buffer)
        for _ in range(64):  # then let the loop's other callbacks in
            try:
                size = self.sock.recv_into(self._buffer)
            except BlockingIOError:
                return
            except OSError:
                size = 0
            if not size:
                self._died()
                return
            self._datagram(view[:size])

    def _datagram(self, data: memoryview) -> None:
        """A datagram's records in order; its audio pushed in one go, before any other
        record (a marker counts the frames received before it)."""
        audio: list[slots.Decoded] = []
        for kind, conn, payload in intakewire.records(data):
            remote = self.remotes.get(conn)
            if remote is None:
                continue
            if kind == intakewire.AUDIO:
                pushed = remote.audio_now(payload)
                if pushed is not None:
                    audio.append(pushed)
                continue
            if audio:
                self.buffers.push_decoded(audio)
                audio = []
            self._record(remote, kind, payload)
        if audio:
            self.buffers.push_decoded(audio)

    def _record(self, remote: Remote, kind: int, payload: memoryview) -> None:
        if kind == intakewire.CLOSED:
            if not remote.closed.done():
                remote.closed.set_result(None)
            return
        remote.take(kind, payload)

    def _died(self) -> None:
        if self.dead:
            return
        self._detach()
        for remote in list(self.remotes.values()):
            remote.lost()
        self.loop.run_in_executor(None, self.process.wait)  # reaped
        self._on_dead(self)

    def close(self) -> None:
        """The process exits once its socket is closed."""
        if not self.dead:
            self._detach()

    def _detach(self) -> None:
        """No more records either way: the pod's end of the socket pair is closed."""
        self.dead = True
        self.loop.remove_reader(self.sock)
        self.loop.remove_writer(self.sock)
        self.sock.close()


class IntakeWorkers:
    """The pod's N intake processes, and the shared record of samples taken per slot."""

    def __init__(self, count: int, buffers: slots.SlotBuffers,
                 config: settings.ServerSettings, loop: asyncio.AbstractEventLoop,
                 on_restart: Callable[[int], None]) -> None:
        self._taken_fd = os.memfd_create("asrpool-taken")
        os.ftruncate(self._taken_fd, buffers.total * 8)
        self._taken_map = mmap.mmap(self._taken_fd, buffers.total * 8)
        taken: NDArray[np.int64] = np.frombuffer(self._taken_map, dtype=np.int64)
        buffers.publish_taken(taken)
        self._buffers = buffers
        self._limits = limits_of(config)
        self._max_bytes = config.max_message_bytes
        self._loop = loop
        self._on_restart = on_restart
        self._ids = itertools.count(1)
        self._closing = False
        self.workers = [self._start(index) for index in range(count)]

    def _start(self, index: int) -> Worker:
        return Worker(index, self._taken_fd, self._buffers, self._limits, self._loop,
                      self._dead)

    def _dead(self, worker: Worker) -> None:
        if self._closing:
            return
        logger.error("intake process %d (pid %d) ended: its %d streams are told, a new one "
                     "starts", worker.index, worker.process.pid, len(worker.remotes))
        self.workers[worker.index] = self._start(worker.index)
        self._on_restart(worker.index)

    def hand_over(self, connection: framing.WebSocketProtocol,
                  handle: handles.Handle) -> Remote:
        """The accepted connection goes to the least busy intake process, with its
        first messages (``Ready``, then results waiting for a resumed stream); raises
        :class:`framing.EarlyFrames` if it cannot (it stays on the pod's loop)."""
        worker = min(self.workers, key=lambda w: len(w.remotes))
        remote = Remote(next(self._ids), worker, handle, connection, self._max_bytes)
        transport = connection.hand_over(lambda: remote.queue(_SHUTDOWN, b""))
        transport.pause_reading()
        sock = transport.get_extra_info("socket")
        opening = intakewire.Opening(handle.slot, handle.received(), handle.kind(),
                                     [protocol.ready(), *handle.take_waiting()])
        worker.open(remote, sock.fileno(), opening)
        handle.write_through(remote.send)
        return remote

    def done(self, remote: Remote) -> None:
        remote.worker.forget(remote)

    def after_step(self) -> None:
        """A step's results are posted: each process looks at its held-back streams."""
        for worker in self.workers:
            if worker.remotes:
                worker.send_record(intakewire.TICK, 0)

    def close(self) -> None:
        """Close the processes' sockets (on the event loop): each then exits."""
        self._closing = True
        for worker in self.workers:
            worker.close()

    def wait(self) -> None:
        """Wait for the processes to exit (in a thread: it blocks), killing any late."""
        for worker in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.process.wait(5)
            if worker.process.poll() is None:
                worker.process.kill()
        os.close(self._taken_fd)
