"""One token, one connection: a resume claims its stream at once, before its handshake
ends, so a second resume with the same token waits for the first to end instead of
attaching alongside it (two writers on one outbox, two readers into one slot)."""

from __future__ import annotations

import asyncio
import contextlib
import random

from asrpool.server import outcomes, sessions, slots


def _held() -> tuple[sessions.Sessions, sessions.Stream]:
    streams = sessions.Sessions(slots.SlotBuffers(1), 5.0, 100, lambda: None)
    stream = streams.open(resumable=True)
    assert stream is not None
    streams.attach(stream)
    streams.finish(stream, outcomes.Lost())  # the connection dropped: held for a resume
    return streams, stream


async def test_a_second_resume_waits_for_the_first_claim_to_end() -> None:
    streams, stream = _held()
    first = await streams.reclaim(stream.resume_token)  # its handshake still under way
    assert first is stream
    second = asyncio.create_task(streams.reclaim(stream.resume_token))
    await asyncio.sleep(0.01)
    assert not second.done(), "the second resume took a stream already claimed"
    kick = streams.attach(first)  # the first handshake completes
    assert kick.done() and isinstance(kick.result(), outcomes.Replaced)
    streams.finish(first, kick.result())
    assert await asyncio.wait_for(second, 1) is stream
    assert stream.attached


async def test_a_claim_whose_handshake_fails_keeps_the_stream_held() -> None:
    streams, stream = _held()
    claimed = await streams.reclaim(stream.resume_token)
    assert claimed is stream
    streams.finish(claimed, outcomes.Lost())  # the client left during the handshake
    assert streams.used == 1 and stream.expiry is not None  # held for the grace again
    assert await asyncio.wait_for(streams.reclaim(stream.resume_token), 1) is stream


def _attached() -> tuple[sessions.Sessions, sessions.Stream, asyncio.Future[outcomes.Outcome]]:
    streams = sessions.Sessions(slots.SlotBuffers(1), 5.0, 100, lambda: None)
    stream = streams.open(resumable=True)
    assert stream is not None
    return streams, stream, streams.attach(stream)


async def test_an_end_asked_for_while_the_connection_is_seen_lost_frees_the_slot() -> None:
    """The router closed cleanly, the pod had not read the close (it held the audio
    before it), so the router dropped the link and asked for the end: the handler had
    already judged the connection lost when the request came. The slot is freed, not
    held for a resume (it was held for the whole grace, in 1 of 4 runs of the compat
    test through a router)."""
    streams, stream, kick = _attached()
    assert streams.end(stream.resume_token)
    assert kick.done() and isinstance(kick.result(), outcomes.Closed)
    streams.finish(stream, outcomes.Lost())  # what the handler had decided before
    assert streams.used == 0 and stream.expiry is None


async def test_an_end_asked_for_after_the_connection_was_lost_frees_the_slot() -> None:
    streams, stream, _ = _attached()
    streams.finish(stream, outcomes.Lost())
    assert streams.used == 1  # held for a resume
    assert streams.end(stream.resume_token)
    assert streams.used == 0
    assert await streams.reclaim(stream.resume_token) is None


async def _connection(streams: sessions.Sessions, token: str, rng: random.Random,
                      attached: list[int]) -> None:
    """One resume as the websocket handler runs it, with random delays between its
    steps: reclaim, handshake, attach, serve until replaced (or a while), finish."""
    stream = await streams.reclaim(token)
    if stream is None:
        return
    await asyncio.sleep(rng.random() * 0.002)  # the handshake
    kick = streams.attach(stream)
    attached.append(1)
    assert sum(attached) == 1, "two connections attached to one stream"
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(kick), rng.random() * 0.004)
    attached.append(-1)
    streams.finish(stream, kick.result() if kick.done() else outcomes.Lost())


async def test_racing_resumes_never_attach_two_connections() -> None:
    """Many resumes with one token, in many interleavings: at no moment are two
    connections attached to the stream."""
    rng = random.Random(43)
    for _ in range(50):
        streams, stream = _held()
        attached: list[int] = []
        await asyncio.gather(*(_connection(streams, stream.resume_token, rng, attached)
                               for _ in range(rng.randint(2, 8))))
        assert sum(attached) == 0 and attached.count(1) >= 1
        assert streams.used == 1  # the last one lost its connection: held for a resume
