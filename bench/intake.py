"""What each stream sends a pod per 80 ms step in ``bench capacity``: the input kinds.

Every kind goes through the server's own intake code: ``protocol.decode_client`` on the
message bytes as a client sends them (msgpack, float32 PCM as Kyutai's clients pack it),
then for Opus the stream's own decoder (``server.inputs``), then the slot's buffer.

- ``pcm-80ms``: one ``Audio`` message of 1,920 samples per stream per step (Kyutai's
  file client, and 80 ms microphone chunks);
- ``pcm-1s``: one ``Audio`` message of 12 frames (0.96 s) every 12 steps, the streams
  staggered so that each step takes a twelfth of them;
- ``opus``: ``OggOpus`` messages of one page each as sphn's stream writer cuts them
  (40 ms: two per step), each stream with its own decoder over one Ogg stream;
- ``opus-lanes``: the same pages decoded by the pod's Opus lanes
  (``server.opuslanes``, ``LANES`` children) as ``--opus-workers`` does: the step waits
  for their answers, but only the pod's own CPU counts as its host work.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

import msgpack
import numpy as np
from numpy.typing import NDArray

from asrpool.bench import isolation
from asrpool.common import protocol
from asrpool.server import inputs, opuslanes, slots

KINDS = ("pcm-80ms", "pcm-1s", "opus", "opus-lanes")
LANES = 2
FRAMES_PER_SECOND_MESSAGE = 12
_BANK_FRAMES = 50  # distinct PCM frames, cycled (4 s of audio)


class Intake(Protocol):
    def feed(self, buffers: slots.SlotBuffers, step: int) -> None:
        """Every stream's messages of one step, into its slot's buffer."""

    def close(self) -> None:
        """Stop whatever the intake started."""


def build(kind: str, batch: int, steps: int) -> Intake:
    """An intake of ``kind`` for ``batch`` streams, enough for ``steps`` steps."""
    if kind == "pcm-80ms":
        return PcmIntake(batch, 1)
    if kind == "pcm-1s":
        return PcmIntake(batch, FRAMES_PER_SECOND_MESSAGE)
    if kind == "opus":
        return OpusIntake(batch, steps)
    if kind == "opus-lanes":
        return LanedOpusIntake(batch, steps)
    raise ValueError(f"unknown input kind {kind!r}: one of {', '.join(KINDS)}")


def _audio(frames: int) -> NDArray[np.float32]:
    return isolation.speechlike(frames * protocol.FRAME_SIZE / protocol.SAMPLE_RATE, seed=0)


class PcmIntake:
    """``Audio`` messages of ``frames`` frames, one per stream every ``frames`` steps."""

    def __init__(self, batch: int, frames: int) -> None:
        self.batch, self.frames = batch, frames
        audio = _audio(_BANK_FRAMES * frames).reshape(_BANK_FRAMES, frames * protocol.FRAME_SIZE)
        self.bank = [msgpack.packb({"type": "Audio", "pcm": chunk.tolist()},
                                   use_single_float=True)  # as Kyutai's clients send it
                     for chunk in audio]
        self.filled = False

    def close(self) -> None:
        pass

    def feed(self, buffers: slots.SlotBuffers, step: int) -> None:
        for slot in range(self.batch):
            # A first message for every stream, then each on its turn: none runs dry.
            if not self.filled or (step + slot) % self.frames == 0:
                self._push(buffers, slot, step)
        self.filled = True

    def _push(self, buffers: slots.SlotBuffers, slot: int, step: int) -> None:
        message = protocol.decode_client(self.bank[(step + 7 * slot) % len(self.bank)])
        assert message["type"] == "Audio"
        buffers.push_audio(slot, message["pcm"])


class OpusIntake:
    """Each stream's Ogg Opus stream, one page per message, two pages per step."""

    PAGES_PER_STEP = 2

    def __init__(self, batch: int, steps: int) -> None:
        import sphn

        self.batch = batch
        writer = sphn.OpusStreamWriter(protocol.SAMPLE_RATE)
        audio = _audio(steps + 4)
        quarter = protocol.FRAME_SIZE // 4
        chunks = [bytes(writer.append_pcm(audio[i:i + quarter]))
                  for i in range(0, len(audio), quarter)]
        pages = [chunk for chunk in chunks if chunk]
        pages[:2] = [pages[0] + pages[1]]  # the headers go with the first audio page
        self.bank = [msgpack.packb({"type": "OggOpus", "data": page}) for page in pages]
        self.inputs = [inputs.StreamInput() for _ in range(batch)]

    def close(self) -> None:
        pass

    def messages(self, step: int) -> list[bytes]:
        first = step * self.PAGES_PER_STEP
        messages = self.bank[first:first + self.PAGES_PER_STEP]
        assert messages, "the intake was built for fewer steps"
        return messages

    def feed(self, buffers: slots.SlotBuffers, step: int) -> None:
        messages = self.messages(step)
        for slot, stream in enumerate(self.inputs):
            for data in messages:
                message = protocol.decode_client(data)
                assert message["type"] == "OggOpus"
                buffers.push_audio(slot, stream.opus_decoder().decode(message["data"]))


class LanedOpusIntake(OpusIntake):
    """:class:`OpusIntake`'s pages handed to Opus lanes, as a pod with ``--opus-workers``
    does; a step's feed returns once every page's audio is in its slot's buffer."""

    def __init__(self, batch: int, steps: int) -> None:
        super().__init__(batch, steps)
        self._loop = asyncio.new_event_loop()  # never run: failures would wait there
        self._lanes: opuslanes.OpusLanes | None = None

    def close(self) -> None:
        if self._lanes is not None:
            self._lanes.close()
        self._loop.close()

    def feed(self, buffers: slots.SlotBuffers, step: int) -> None:
        if self._lanes is None:
            self._lanes = opuslanes.OpusLanes(LANES, buffers, self._loop, self._failed)
        for data in self.messages(step):
            for slot, stream in enumerate(self.inputs):
                message = protocol.decode_client(data)
                assert message["type"] == "OggOpus"
                opus = stream.opus_decoder()
                opus.take(message["data"])
                lane = self._lanes.lane(slot)
                generation = buffers.generation(slot)
                for page, declared in opus.next_pages(None):
                    lane.send_page(slot, generation, page, declared)
        while buffers.being_decoded():
            time.sleep(0.0002)

    @staticmethod
    def _failed(slot: int, generation: int, reason: str) -> None:
        raise AssertionError(f"slot {slot}: {reason}")
