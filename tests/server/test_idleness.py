"""The idle deadline's one timer (``server.idleness``): it cancels a reader that waits
for a message past the deadline, and only then; activity, a busy reader and audio the
engine still has each put it off."""

from __future__ import annotations

import asyncio

import pytest

from asrpool.server import idleness

SECONDS = 0.2


@pytest.fixture(autouse=True)
def _look_again_soon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idleness, "LOOK_AGAIN_S", 0.05)


async def _reader(busy: list[bool], waits: float, active_every: float = 0.0,
                  waiting: bool = True) -> tuple[str, float]:
    """Waits (as for a message) up to ``waits`` seconds; how it ended, and when."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    idle = idleness.IdleWatch(SECONDS, lambda: busy[0])
    idle.waiting = waiting
    try:
        while loop.time() - started < waits:
            await asyncio.sleep(active_every or waits)
            if active_every:
                idle.active()
        return "done", loop.time() - started
    except asyncio.CancelledError:
        if idle.expired():
            return "idle", loop.time() - started
        raise
    finally:
        idle.close()


async def test_a_waiting_reader_is_ended_at_the_deadline_and_not_as_cancelled() -> None:
    task = asyncio.create_task(_reader([False], waits=2.0))
    how, after = await task
    assert how == "idle" and SECONDS <= after < SECONDS + 0.5
    assert not task.cancelled() and task.cancelling() == 0


async def test_activity_puts_the_deadline_off() -> None:
    how, after = await _reader([False], waits=3 * SECONDS, active_every=SECONDS / 4)
    assert how == "done" and after >= 3 * SECONDS


async def test_audio_the_engine_still_has_puts_the_deadline_off() -> None:
    busy = [True]
    asyncio.get_running_loop().call_later(3 * SECONDS, busy.__setitem__, 0, False)
    how, after = await _reader(busy, waits=2.0)
    assert how == "idle" and after >= 3 * SECONDS


async def test_a_reader_busy_elsewhere_is_not_idle() -> None:
    """Held back for room (pushing, not receiving): no idleness."""
    how, after = await _reader([False], waits=3 * SECONDS, waiting=False)
    assert how == "done" and after >= 3 * SECONDS


async def test_a_reader_cancelled_for_another_reason_stays_cancelled() -> None:
    task = asyncio.create_task(_reader([False], waits=2.0))
    await asyncio.sleep(SECONDS / 4)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class _Socket:
    """A websocket whose next event comes when the test says."""

    def __init__(self) -> None:
        self.event: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()

    async def receive(self) -> dict[str, str]:
        return await self.event


async def test_receiving_counts_as_waiting_until_the_event_comes_or_the_socket_fails() -> None:
    idle = idleness.IdleWatch(60.0, lambda: False)
    for ending in ({"type": "websocket.receive"}, RuntimeError("gone")):
        socket = _Socket()
        receiving = asyncio.ensure_future(idle.receive(socket))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert idle.waiting
        if isinstance(ending, dict):
            socket.event.set_result(ending)
            assert await receiving == ending
        else:
            socket.event.set_exception(ending)
            with pytest.raises(RuntimeError):
                await receiving
        assert not idle.waiting
    idle.close()
