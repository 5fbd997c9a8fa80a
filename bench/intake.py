"""What each stream sends a pod per 80 ms step in ``bench capacity``: the input kinds.

Every kind goes through the server's own intake code: ``protocol.decode_client`` on the
message bytes as a client sends them (msgpack, float32 PCM as Kyutai's clients pack it),
then for Opus the stream's own decoder (``server.inputs``), then the slot's buffer.

- ``pcm-80ms``: one ``Audio`` message of 1,920 samples per stream per step (Kyutai's
  file client, and 80 ms microphone chunks);
- ``pcm-1s``: one ``Audio`` message of 12 frames (0.96 s) every 12 steps, the streams
  staggered so that each step takes a twelfth of them;
- ``opus``: ``OggOpus`` messages of one page each as sphn's stream writer cuts them
  (a 40 ms packet of two 20 ms frames per page: two per step), each stream with its own
  decoder over one Ogg stream;
- ``opus-20ms``: the same frames one to a packet and a page (four per step), as an
  encoder set to 20 ms and browsers' recorders send them: the costliest way to send Opus;
- ``opus-lanes``, ``opus-20ms-lanes``: those messages handed to the pod's Opus lanes
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

from asrpool.bench import oggfiles, synthetic
from asrpool.common import oggopus, processes, protocol
from asrpool.server import inputs, opuslanes, slots

KINDS = ("pcm-80ms", "pcm-1s", "opus", "opus-20ms", "opus-lanes", "opus-20ms-lanes")
LANES = 2
FRAMES_PER_SECOND_MESSAGE = 12
_BANK_FRAMES = 50  # distinct PCM frames, cycled (4 s of audio)
_LANE_ROOM = 10 * protocol.SAMPLE_RATE  # a slot's buffer, as a pod's default


class Intake(Protocol):
    messages_per_step: float  # each stream's messages per 80 ms step
    message_bytes: int  # their size (the median)

    def feed(self, buffers: slots.SlotBuffers, step: int) -> None:
        """Every stream's messages of one step, into its slot's buffer."""

    def close(self) -> None:
        """Stop whatever the intake started."""

    def helpers_cpu_s(self) -> float:
        """CPU seconds used so far by the processes the intake hands work to (the Opus
        lanes' children; 0 for an intake that does all its work in the pod)."""


def build(kind: str, batch: int, steps: int) -> Intake:
    """An intake of ``kind`` for ``batch`` streams, enough for ``steps`` steps."""
    if kind == "pcm-80ms":
        return PcmIntake(batch, 1)
    if kind == "pcm-1s":
        return PcmIntake(batch, FRAMES_PER_SECOND_MESSAGE)
    if kind in ("opus", "opus-20ms"):
        return OpusIntake(batch, steps, one_packet_pages=kind == "opus-20ms")
    if kind in ("opus-lanes", "opus-20ms-lanes"):
        return LanedOpusIntake(batch, steps, one_packet_pages=kind == "opus-20ms-lanes")
    raise ValueError(f"unknown input kind {kind!r}: one of {', '.join(KINDS)}")


def _audio(frames: int) -> NDArray[np.float32]:
    return synthetic.speechlike(frames * protocol.FRAME_SIZE / protocol.SAMPLE_RATE, seed=0)


class PcmIntake:
    """``Audio`` messages of ``frames`` frames, one per stream every ``frames`` steps."""

    def __init__(self, batch: int, frames: int) -> None:
        self.batch, self.frames = batch, frames
        audio = _audio(_BANK_FRAMES * frames).reshape(_BANK_FRAMES, frames * protocol.FRAME_SIZE)
        self.bank = [msgpack.packb({"type": "Audio", "pcm": chunk.tolist()},
                                   use_single_float=True)  # as Kyutai's clients send it
                     for chunk in audio]
        self.filled = False
        self.messages_per_step = 1 / frames
        self.message_bytes = len(self.bank[0])

    def close(self) -> None:
        pass

    def helpers_cpu_s(self) -> float:
        return 0.0

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
    """Each stream's Ogg Opus stream, one page per message: 40 ms pages as sphn's
    writer cuts them, or (``one_packet_pages``) a page per 20 ms packet."""

    def __init__(self, batch: int, steps: int, one_packet_pages: bool = False) -> None:
        self.batch = batch
        # sphn's writer holds back a varying few pages at the end: a margin of frames
        pages = _opus_pages(_audio(steps + 8))
        if one_packet_pages:
            pages = _one_packet_pages(pages)
        self.per_step = 4 if one_packet_pages else 2  # 20 or 40 ms pages per 80 ms step
        pages[:3] = [b"".join(pages[:3])]  # the headers go with the first audio page
        assert len(pages) >= (steps + 2) * self.per_step, "sphn held back more than 6 frames"
        self.bank = [msgpack.packb({"type": "OggOpus", "data": page}) for page in pages]
        self.inputs = [inputs.StreamInput() for _ in range(batch)]
        self.messages_per_step = float(self.per_step)
        self.message_bytes = sorted(len(message) for message in self.bank)[len(self.bank) // 2]

    def close(self) -> None:
        pass

    def helpers_cpu_s(self) -> float:
        return 0.0

    def messages(self, step: int) -> list[bytes]:
        first = step * self.per_step
        messages = self.bank[first:first + self.per_step]
        assert len(messages) == self.per_step, "the intake was built for fewer steps"
        return messages

    def feed(self, buffers: slots.SlotBuffers, step: int) -> None:
        messages = self.messages(step)
        for slot, stream in enumerate(self.inputs):
            for data in messages:
                message = protocol.decode_client(data)
                assert message["type"] == "OggOpus"
                buffers.push_audio(slot, stream.opus_decoder().decode(message["data"]))


def _opus_pages(audio: NDArray[np.float32]) -> list[bytes]:
    """OpusHead, OpusTags, then 40 ms pages of ``audio``, as sphn's stream writer cuts them."""
    import sphn

    writer = sphn.OpusStreamWriter(protocol.SAMPLE_RATE)
    quarter = protocol.FRAME_SIZE // 4
    chunks = [bytes(writer.append_pcm(audio[i:i + quarter]))
              for i in range(0, len(audio), quarter)]
    pages = [page for chunk in chunks if chunk for page in _split_pages(chunk)]
    assert oggopus.page_size(pages[0]) == len(pages[0]) and b"OpusHead" in pages[0]
    return pages


def _split_pages(data: bytes) -> list[bytes]:
    pages = []
    while data:
        size = oggopus.page_size(data)
        assert size is not None
        pages.append(data[:size])
        data = data[size:]
    return pages


def _one_packet_pages(pages: list[bytes]) -> list[bytes]:
    """The same Ogg Opus stream as an encoder set to 20 ms sends it: sphn's 40 ms packets
    (two 20 ms frames each) split into packets of one frame, one packet to a page."""
    packets = [frame for page in pages[2:] for packet in _packets(page)
               for frame in oggfiles.single_frames(packet)]
    return _split_pages(oggfiles.opus_file(packets, oggfiles.FRAME_20_MS, per_page=1))


def _packets(page: bytes) -> list[bytes]:
    """A page's packets (each within the page: sphn's pages end on packets)."""
    segments = page[26]
    lacing = page[oggopus.PAGE_HEADER:oggopus.PAGE_HEADER + segments]
    packets, current, at = [], b"", oggopus.PAGE_HEADER + segments
    for size in lacing:
        current += page[at:at + size]
        at += size
        if size < 255:
            packets.append(current)
            current = b""
    assert not current, "a packet runs on to the next page"
    return packets


class LanedOpusIntake(OpusIntake):
    """:class:`OpusIntake`'s messages handed to Opus lanes, as a pod with
    ``--opus-workers`` does; a step's feed returns once every stream has a frame
    buffered. Each step sends the messages of the step after it (the first, two steps'):
    a child answers a stream by whole frames and Opus's pre-skip leaves each stream's
    decoded audio short of its last frame by a little, so a step fed only its own
    messages would wait on every stream for the pod's ``ROOM`` (a pod's engine steps
    whichever streams have a frame and waits on none)."""

    def __init__(self, batch: int, steps: int, one_packet_pages: bool = False) -> None:
        super().__init__(batch, steps, one_packet_pages)
        self._loop = asyncio.new_event_loop()  # never run: failures would wait there
        self._lanes: opuslanes.OpusLanes | None = None
        self._generations: list[int] = []

    def close(self) -> None:
        if self._lanes is not None:
            self._lanes.close()
        self._loop.close()

    def helpers_cpu_s(self) -> float:
        if self._lanes is None:
            return 0.0
        return sum(processes.cpu_seconds(pid) for pid in self._lanes.pids())

    def feed(self, buffers: slots.SlotBuffers, step: int) -> None:
        if self._lanes is None:
            self._lanes = opuslanes.OpusLanes(LANES, buffers, _LANE_ROOM, self._loop,
                                              self._failed)
            self._generations = [buffers.generation(slot) for slot in range(self.batch)]
            self._send(self.messages(step), self._lanes)
        self._send(self.messages(step + 1), self._lanes)
        self._wait_for_frames(buffers, self._lanes)

    def _send(self, messages: list[bytes], lanes: opuslanes.OpusLanes) -> None:
        for data in messages:
            for slot, stream in enumerate(self.inputs):  # as a stream's Handle does
                message = protocol.decode_client(data)
                assert message["type"] == "OggOpus"
                stream.claim("OggOpus")
                lanes.lane(slot).send_data(slot, self._generations[slot], message["data"])

    def _wait_for_frames(self, buffers: slots.SlotBuffers, lanes: opuslanes.OpusLanes) -> None:
        """Until every stream has a frame buffered. A child sends a stream's audio once
        it makes a frame: the first pages, short of one, are asked for after a while.
        Only the engine takes audio, so a slot found with a frame keeps it: each slot is
        looked at until it has one, not again (the pod's engine waits without polling;
        the bench's wait should cost the pod as little)."""
        asked = time.monotonic() + 0.05
        slot = 0
        while slot < self.batch:
            if buffers.buffered(slot) >= protocol.FRAME_SIZE:
                slot += 1
                continue
            if time.monotonic() > asked:
                for waiting, generation in buffers.unsettled():
                    lanes.lane(waiting).send_room(waiting, generation)
                asked = float("inf")
            time.sleep(0.001)

    @staticmethod
    def _failed(slot: int, generation: int, reason: str) -> None:
        raise AssertionError(f"slot {slot}: {reason}")
