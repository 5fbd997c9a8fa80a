"""One token, one connection: a resume claims its stream at once, before its handshake
ends, so a second resume with the same token waits for the first to end instead of
attaching alongside it (two writers on one outbox, two readers into one slot)."""

from __future__ import annotations

import asyncio

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
