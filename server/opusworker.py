"""A pod's Opus decoding child: Ogg pages in on standard input, 24 kHz PCM out.

sphn holds the GIL while it decodes (some 50 us per 40 ms page here), so a pod that
decoded every stream's pages itself would spend its one event loop on them. With
``--opus-workers N`` it hands them to N of these children instead (:mod:`opuslanes`),
each slot to one child, which keeps that slot's decoder. Records both ways are
:data:`HEADER` (kind, slot, generation, length) then ``length`` bytes:

- ``PAGE`` in: one whole Ogg page, already framed and checked by the pod; out: ``PCM``
  (float32, native order) or ``FAILED`` (the reason, UTF-8), after which that stream's
  further pages are dropped unanswered (the pod ends it);
- ``MARKER`` (8 bytes: the id) and ``INIT`` in: echoed out in their place among the
  pages, so the pod applies them after the audio sent before them, in message order.

A page of a new generation on a slot starts a new decoder there (a new stream); so
the child holds at most one decoder per slot it serves. It reads whatever has come,
decodes it, and answers in one write; it exits at the end of its input.
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Any

import numpy as np
from numpy.typing import NDArray

from asrpool.common import protocol

HEADER = struct.Struct("<BIII")  # kind, slot, generation, payload length
PAGE, PCM, FAILED, MARKER, INIT = range(5)
_READ = 1 << 20


def record(kind: int, slot: int, generation: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, slot, generation, len(payload)) + payload


class Decoders:
    """One sphn stream reader per slot, for its current generation."""

    def __init__(self) -> None:
        self._readers: dict[int, tuple[int, Any]] = {}
        self._failed: set[tuple[int, int]] = set()

    def answer(self, kind: int, slot: int, generation: int, payload: bytes) -> bytes:
        """The record(s) answering one input record (empty: nothing to say)."""
        if (slot, generation) in self._failed:
            return b""
        if kind != PAGE:
            return record(kind, slot, generation, payload)
        try:
            pcm = self._decode(slot, generation, payload)
        except ValueError as exc:  # sphn reports what it cannot decode as ValueError
            self._failed.add((slot, generation))
            return record(FAILED, slot, generation,
                          f"undecodable Ogg Opus data: {exc}".encode())
        problem = protocol.sample_problem(pcm)
        if problem is not None:
            self._failed.add((slot, generation))
            return record(FAILED, slot, generation,
                          f"decoded Ogg Opus audio {problem}".encode())
        return record(PCM, slot, generation, pcm.tobytes())

    def _decode(self, slot: int, generation: int, page: bytes) -> NDArray[np.float32]:
        import sphn

        current = self._readers.get(slot)
        if current is None or current[0] != generation:
            self._failed = {key for key in self._failed if key[0] != slot}
            current = (generation, sphn.OpusStreamReader(protocol.SAMPLE_RATE))
            self._readers[slot] = current
        pcm = current[1].append_bytes(page)
        return np.ascontiguousarray(np.asarray(pcm, dtype=np.float32).reshape(-1))


def serve(read_fd: int, write_fd: int) -> None:
    decoders = Decoders()
    pending = b""
    while chunk := os.read(read_fd, _READ):
        pending += chunk
        out, at = [], 0
        while len(pending) - at >= HEADER.size:
            kind, slot, generation, length = HEADER.unpack_from(pending, at)
            if len(pending) - at - HEADER.size < length:
                break
            start = at + HEADER.size
            out.append(decoders.answer(kind, slot, generation, pending[start:start + length]))
            at = start + length
        pending = pending[at:]
        _write_all(write_fd, b"".join(out))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def main() -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    serve(sys.stdin.fileno(), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
