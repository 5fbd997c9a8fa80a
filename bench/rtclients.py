"""Real-time Kyutai clients cheap enough to drive a thousand streams from two cores.

``bench server`` measures a pod, not its clients: with the websockets library each
client costs a task wake-up and a frame parse per message, and a few hundred of them
outrun the machine that runs the pod, which would count as the pod's latency. These
clients speak just enough RFC 6455 on raw asyncio protocols (uvloop), as
:mod:`wsload`'s do, and send pre-encoded, pre-masked ``Audio`` frames (the mask is
fixed: a server unmasks whatever the key), all of a process's streams from one ticker
that wakes ``SUB_TICKS`` times per 80 ms frame, never one timer per stream.

Each stream times every frame, from the moment its last byte is written, to the ``Step``
of the step that consumed it (``step_idx`` counts a stream's frames from 1), so a
model with extra heads (a ``Step`` per frame) is required: the paced engine of
``stt-1b-en_fr`` answers as that model does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import msgpack
import numpy as np

from asrpool.bench import wsload
from asrpool.common import protocol

FRAME_SECONDS = protocol.FRAME_SIZE / protocol.SAMPLE_RATE
SUB_TICKS = 8  # sends per frame interval, each for an eighth of the streams
OPENING_AT_ONCE = 32  # upgrades in flight per process
_MASK = b"\x5a\x17\xc3\x08"


@dataclasses.dataclass
class Outcome:
    """One process's streams: frame latencies (s), refusals, frames sent, streams the
    pod shed (ended with ``Error{code:"overloaded"}``: it fell behind real time)."""

    latencies: list[float]
    refused: int
    frames_sent: int
    shed: int = 0
    cpu_s: float = 0.0  # the clients' process's CPU over the run

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def audio_frames(seed: int, bank: int = 16) -> list[bytes]:
    """``bank`` distinct masked websocket frames, each one 80 ms ``Audio`` message of
    quiet noise (streams cycle through them; their content matters to no stand-in)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(bank):
        pcm = (0.1 * rng.standard_normal(protocol.FRAME_SIZE)).astype(np.float32)
        message = msgpack.packb({"type": "Audio", "pcm": pcm.tolist()}, use_single_float=True)
        out.append(wsload.frame(message, 2, _MASK))
    return out


class Stream(wsload.Stream):
    """One stream: ``Ready`` first, then each ``Step`` timed against its frame."""

    def __init__(self, path: str, host: str, latencies: list[float]) -> None:
        super().__init__(path, host, latencies)
        self.sent_at: dict[int, float] = {}
        self.frames = 0
        self.error_code: str | None = None  # of the Error that ended the stream

    def _frame(self, opcode: int, payload: bytes) -> None:
        if opcode != 2 or not self.ready.is_set():
            super()._frame(opcode, payload)
            return
        message = msgpack.unpackb(payload)
        if message.get("type") == "Error":
            self.error_code = str(message.get("code"))
        elif message.get("type") == "Step":
            sent = self.sent_at.pop(message.get("step_idx"), None)
            if sent is not None:
                self.rtts.append(time.perf_counter() - sent)

    def send_frame(self, frame: bytes) -> None:
        if self.transport.is_closing():
            return
        self.frames += 1
        self.transport.write(frame)
        self.sent_at[self.frames] = time.perf_counter()


async def _open(host: str, port: int, path: str, gate: asyncio.Semaphore,
                latencies: list[float]) -> Stream | None:
    """A stream that answered ``Ready``, or None (refused or unreachable)."""
    loop = asyncio.get_running_loop()
    async with gate:
        try:
            _, stream = await loop.create_connection(
                lambda: Stream(path, host, latencies), host, port)
            await asyncio.wait_for(stream.ready.wait(), 60)
        except (OSError, TimeoutError):
            return None
    if stream.first != wsload.READY:
        stream.transport.close()
        return None
    return stream


async def _tick(streams: list[Stream], frames: int, bank: list[bytes]) -> None:
    """Every stream's frame once per 80 ms, in ``SUB_TICKS`` groups spread over it."""
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.1
    for index in range(frames):
        for sub in range(SUB_TICKS):
            due = start + (index + sub / SUB_TICKS) * FRAME_SECONDS
            await asyncio.sleep(max(0.0, due - loop.time()))
            frame = bank[index % len(bank)]
            for stream in streams[sub::SUB_TICKS]:
                stream.send_frame(frame)


async def _close(streams: list[Stream]) -> None:
    for stream in streams:
        if not stream.transport.is_closing():
            stream.transport.write(wsload.CLIENT_CLOSE)
    await asyncio.wait([asyncio.ensure_future(s.closed.wait()) for s in streams], timeout=10)
    for stream in streams:
        stream.transport.abort()


async def run(host: str, port: int, path: str, count: int, seconds: float,
              seed: int = 0) -> Outcome:
    """``count`` streams of ``seconds`` of real-time audio each, then their clean close."""
    latencies: list[float] = []
    gate = asyncio.Semaphore(OPENING_AT_ONCE)
    opened = await asyncio.gather(*(_open(host, port, path, gate, latencies)
                                    for _ in range(count)))
    streams = [s for s in opened if s is not None]
    await _tick(streams, int(seconds / FRAME_SECONDS), audio_frames(seed))
    await asyncio.sleep(2.0)  # the last frames' Steps
    await _close(streams)
    shed = sum(s.error_code == protocol.ErrorCode.OVERLOADED for s in streams)
    return Outcome(latencies, count - len(streams), sum(s.frames for s in streams), shed)


def run_in_process(host: str, port: int, path: str, count: int, seconds: float,
                   seed: int) -> dict[str, Any]:
    """:func:`run` on uvloop, as a process pool's job."""
    import uvloop

    started = time.process_time()
    outcome = uvloop.run(run(host, port, path, count, seconds, seed))
    outcome.cpu_s = time.process_time() - started
    return outcome.as_dict()
