"""Pure pieces of the pod, without processes: slot buffers, replay after a lost connection."""

from __future__ import annotations

import numpy as np

from asrpool.server import events, sessions, slots


def test_frames_cross_message_boundaries_and_markers_count_full_frames() -> None:
    buffers = slots.SlotBuffers(2)
    generation = buffers.start(1)
    pcm = np.arange(5000, dtype=np.float32)
    buffers.push_audio(1, pcm[:1000])
    buffers.push_audio(1, pcm[1000:5000])
    buffers.push_marker(1, 9)  # two full frames buffered, 1160 samples left over
    first = buffers.take(timeout=0)
    assert first is not None
    assert (first.resets, first.markers, first.generations) == ([1], [(1, 9, 2)], {1: generation})
    np.testing.assert_array_equal(first.frames[1], pcm[:1920])
    second = buffers.take(timeout=0)
    assert second is not None
    np.testing.assert_array_equal(second.frames[1], pcm[1920:3840])
    assert second.buffered == {1: 5000 - 3840}
    assert buffers.received(1) == 5000


def test_a_stream_without_audio_gives_the_engine_nothing_to_do() -> None:
    """Its reset waits for its first frame or marker: a client that connects and leaves
    (churn) costs the engine no reset; the reset then comes in the frame's batch."""
    buffers = slots.SlotBuffers(2)
    buffers.start(0)
    buffers.start(1)
    buffers.stop(1)  # connected and left
    assert not buffers.pending()
    buffers.push_audio(0, np.zeros(1000, dtype=np.float32))
    assert not buffers.pending()  # less than a frame
    buffers.push_marker(0, 4)
    batch = buffers.take(timeout=0)
    assert batch is not None
    assert (batch.resets, batch.markers, list(batch.frames)) == ([0], [(0, 4, 0)], [])
    buffers.push_audio(0, np.zeros(1920, dtype=np.float32))
    batch = buffers.take(timeout=0)
    assert batch is not None and (batch.resets, list(batch.frames)) == ([], [0])


def test_stop_drops_buffered_audio_and_start_bumps_the_generation() -> None:
    buffers = slots.SlotBuffers(1)
    first = buffers.start(0)
    buffers.push_audio(0, np.zeros(4000, dtype=np.float32))
    buffers.stop(0)
    assert buffers.buffered(0) == 0
    assert buffers.start(0) > first


def test_replay_requeues_what_the_client_never_got() -> None:
    stream = sessions.Stream(slot=0, generation=1)
    for n in range(5):
        stream.post_all([bytes([n])])
    for _ in range(4):
        stream.mark_sent()  # 0..3 written to the socket; 4 still queued
    assert stream.replay_from(received=2) == 2  # the client saw 0 and 1 only
    assert list(stream.outbox) == [b"\x02", b"\x03", b"\x04"]
    assert stream.sent == 2


def test_replay_when_the_client_got_more_than_counted() -> None:
    stream = sessions.Stream(slot=0, generation=1)
    for n in range(3):
        stream.post_all([bytes([n])])
    stream.mark_sent()
    # The writer was cancelled after writing message 1 but before counting it.
    assert stream.replay_from(received=2) == 0
    assert list(stream.outbox) == [b"\x02"]
    assert stream.sent == 2


def test_results_are_sent_at_once_only_with_nothing_queued_before_them() -> None:
    stream = sessions.Stream(slot=0, generation=1)
    wire: list[bytes] = []
    can_send = [False]

    def send(messages: list[bytes]) -> bool:
        if can_send[0]:
            wire.extend(messages)
        return can_send[0]

    stream.direct = send
    stream.post_all([b"a", b"b"])  # the transport takes nothing now: queued
    can_send[0] = True
    stream.post_all([b"c"])  # behind a and b, still queued: never ahead of them
    assert wire == [] and list(stream.outbox) == [b"a", b"b", b"c"]
    for _ in range(3):
        stream.mark_sent()  # the writer task sends them
    stream.post_all([b"d", b"e"])
    assert wire == [b"d", b"e"] and not stream.outbox
    assert stream.sent == 5 and list(stream.history) == [b"a", b"b", b"c", b"d", b"e"]
    assert stream.replay_from(received=3) == 2  # what was sent at once replays as well
    assert list(stream.outbox) == [b"d", b"e"]


def test_restart_comes_after_the_audio_before_it_and_keeps_markers_and_generation() -> None:
    """Init (as moshi-server): in message order, the model row resets after every whole
    frame received before it; what the stream had queued stays."""
    buffers = slots.SlotBuffers(1)
    generation = buffers.start(0)
    buffers.push_audio(0, np.zeros(1920, dtype=np.float32))
    first = buffers.take(timeout=0)
    assert first is not None and first.resets == [0]  # the start's reset, with its frame
    buffers.push_audio(0, np.zeros(3 * 1920 + 100, dtype=np.float32))
    buffers.push_marker(0, 5)
    buffers.restart(0)
    buffers.push_audio(0, np.zeros(1820, dtype=np.float32))
    batches = [buffers.take(timeout=0) for _ in range(4)]
    assert [(b.restarts, len(b.frames)) for b in batches if b] == [
        ([], 1), ([], 1), ([], 1), ([0], 1)]  # the 4th frame: 100 samples before, 1820 after
    assert batches[0] is not None and batches[0].markers == [(0, 5, 3)]
    assert all(b is not None and b.generations == {0: generation} for b in batches)
    assert buffers.buffered(0) == 0 and not buffers.pending()


def test_an_init_before_any_frame_is_one_ready_and_no_second_reset() -> None:
    buffers = slots.SlotBuffers(1)
    buffers.start(0)
    buffers.restart(0)
    buffers.restart(0)
    batch = buffers.take(timeout=0)
    assert batch is not None and (batch.resets, batch.restarts, batch.frames) == ([0], [0, 0], {})
    assert not buffers.pending()


def test_a_restart_keeps_pending_markers_as_many_steps_later() -> None:
    decoder = events.WordDecoder(delay=2, detokenize=lambda ids: "w")
    for _ in range(4):
        decoder.feed(3)
    decoder.add_marker(7, frames_pending=1)  # due at step 4 + 1 + 2 = 7
    decoder.reset(keep_markers=True)
    assert [decoder.feed(3) for _ in range(3)][-1] == [events.Marker(7)]
    decoder.add_marker(8, frames_pending=0)
    decoder.reset()
    assert not any(decoder.feed(3) for _ in range(5))
