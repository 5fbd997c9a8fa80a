"""Opus decoded beside the event loop: a pod's lanes to its decoding children.

With ``--opus-workers N`` (N > 0) a stream's ``OggOpus`` pages are framed, checked and
weighed on the event loop as before (:class:`inputs.OpusDecoder`), then handed to one of
N child processes (:mod:`opusworker`; slot ``s`` to child ``s % N``), which decode them
in parallel, outside the pod's GIL. The event loop only queues bytes: a writer thread
per lane batches what was queued into one pipe write, and a reader thread per lane
puts each answer straight into the slot's buffer (:class:`slots.SlotBuffers` is
thread-safe). A page counts as buffered from the moment it is queued, for as many
samples as its packets declare (:meth:`slots.SlotBuffers.promise`), so backpressure and
"every result of the audio received" hold as when it was decoded on the spot. A stream's
markers and ``Init`` go through its lane too, so they land after the audio sent before
them. A page the child cannot decode ends its stream (``bad_audio``), through
``on_failure`` on the event loop; a child that dies ends the streams of its lane and is
started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable

import numpy as np

from asrpool.server import opusworker, slots

logger = logging.getLogger(__name__)

Failure = Callable[[int, int, str], None]  # slot, generation, reason
_MARKER_ID = struct.Struct("<q")
_BATCH = 4096  # records in one write at most


class Lane:
    """One decoding child with its writer and reader threads."""

    def __init__(self, index: int, buffers: slots.SlotBuffers, report: Failure,
                 on_lost: Callable[[int], None]) -> None:
        self.index = index
        self.lost = False  # the child is gone (set by its threads)
        self._buffers = buffers
        self._report = report  # both called from the reader thread
        self._on_lost = on_lost
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._promised: dict[tuple[int, int], list[int]] = {}  # (slot, gen) -> per page
        self._served: dict[int, int] = {}  # slot -> the generation whose decoder is here
        self._lock = threading.Lock()
        self._child = subprocess.Popen(
            # -P: the working directory is not put on sys.path (a checkout's operator/).
            [sys.executable, "-P", "-m", "asrpool.server.opusworker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._threads = [
            threading.Thread(target=self._write, name=f"opus-lane-{index}-w", daemon=True),
            threading.Thread(target=self._read, name=f"opus-lane-{index}-r", daemon=True)]
        for thread in self._threads:
            thread.start()

    def send_page(self, slot: int, generation: int, page: bytes, declared: int) -> None:
        with self._lock:
            self._promised.setdefault((slot, generation), []).append(declared)
            self._served[slot] = generation
        self._buffers.promise(slot, generation, declared)
        self._outbox.put(opusworker.record(opusworker.PAGE, slot, generation, page))

    def send_marker(self, slot: int, generation: int, marker_id: int) -> None:
        self._outbox.put(opusworker.record(opusworker.MARKER, slot, generation,
                                           _MARKER_ID.pack(marker_id)))

    def send_init(self, slot: int, generation: int) -> None:
        self._outbox.put(opusworker.record(opusworker.INIT, slot, generation))

    def close(self, timeout: float = 5.0) -> None:
        self._outbox.put(None)
        for thread in self._threads:
            thread.join(timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._child.wait(timeout)
        if self._child.poll() is None:
            self._child.kill()
            self._child.wait()

    def _write(self) -> None:
        """Everything queued since the last write, in one write (None: stop)."""
        stdin = self._child.stdin
        assert stdin is not None
        stopping = False
        try:
            while not stopping:
                batch = [self._outbox.get()]
                with contextlib.suppress(queue.Empty):
                    while len(batch) < _BATCH and batch[-1] is not None:
                        batch.append(self._outbox.get_nowait())
                stopping = batch[-1] is None
                stdin.write(b"".join(record for record in batch if record is not None))
                stdin.flush()
        except OSError:  # the child died: the reader tells its streams
            self.lost = True
        with contextlib.suppress(OSError):
            stdin.close()

    def _read(self) -> None:
        stdout = self._child.stdout
        assert stdout is not None
        header = opusworker.HEADER
        while head := stdout.read(header.size):
            if len(head) < header.size:
                break
            kind, slot, generation, length = header.unpack(head)
            payload = stdout.read(length) if length else b""
            self._apply(kind, slot, generation, payload)
        self._lost()

    def _apply(self, kind: int, slot: int, generation: int, payload: bytes) -> None:
        if kind == opusworker.PCM:
            pcm = np.frombuffer(payload, dtype=np.float32)
            self._buffers.push_audio(slot, pcm, generation, self._take_promise(slot, generation))
        elif kind == opusworker.MARKER:
            self._buffers.push_marker(slot, _MARKER_ID.unpack(payload)[0], generation)
        elif kind == opusworker.INIT:
            self._buffers.restart(slot, generation)
        elif kind == opusworker.FAILED:
            self._forget(slot, generation)
            self._report(slot, generation, payload.decode(errors="replace"))

    def _take_promise(self, slot: int, generation: int) -> int:
        with self._lock:
            pages = self._promised.get((slot, generation))
            if not pages:
                return 0
            declared = pages.pop(0)
            if not pages:
                del self._promised[(slot, generation)]
            return declared

    def _forget(self, slot: int, generation: int) -> None:
        with self._lock:
            self._promised.pop((slot, generation), None)
        self._buffers.unpromise(slot, generation)

    def _lost(self) -> None:
        """The child's output ended: no stream whose decoder it held can go on (the pod
        ignores those that have ended already)."""
        with self._lock:
            streams, self._promised, self._served = list(self._served.items()), {}, {}
        self.lost = True
        for slot, generation in streams:
            self._buffers.unpromise(slot, generation)
            self._report(slot, generation, "the Opus decoder of this stream failed")
        self._on_lost(self.index)


class OpusLanes:
    """``workers`` lanes; a slot always uses the same one (its decoder lives there)."""

    def __init__(self, workers: int, buffers: slots.SlotBuffers,
                 loop: asyncio.AbstractEventLoop, on_failure: Failure) -> None:
        self._buffers = buffers
        self._loop = loop
        self._on_failure = on_failure
        self._lanes = [self._start(index) for index in range(workers)]
        self._closed = False

    def _start(self, index: int) -> Lane:
        return Lane(index, self._buffers, self._report, self._lost)

    def lane(self, slot: int) -> Lane:
        lane = self._lanes[slot % len(self._lanes)]
        return self._restart(lane.index) if lane.lost else lane

    def _restart(self, index: int) -> Lane:
        """A lane whose child died (its streams were told) gets a new child."""
        lane = self._lanes[index]
        if lane.lost and not self._closed:
            logger.warning("Opus lane %d lost its decoding child: starting another", index)
            lane.close(0.0)
            lane = self._lanes[index] = self._start(index)
        return lane

    def close(self) -> None:
        self._closed = True
        for lane in self._lanes:
            lane.close()

    def _report(self, slot: int, generation: int, reason: str) -> None:
        """From a reader thread: the stream fails on the event loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the pod is gone
            self._loop.call_soon_threadsafe(self._on_failure, slot, generation, reason)

    def _lost(self, index: int) -> None:
        """From a reader thread: its lane starts a new child on the event loop."""
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._restart, index)
