"""How a stream ends: every close or drop frees the slot at once, as moshi-server does,
except a lost connection of a client that asked to resume (``asrpool-resumable: 1``).
The pod's resume grace is 30 s here, so "at once" means well under it."""

from __future__ import annotations

import asyncio

import numpy as np
from websockets.asyncio import client as ws_client

from tests.compat import clients, conftest
from tests.support import kyutai_client, streams

AT_ONCE_S = 5.0  # far under the 30 s grace
BUFFERED_S = 10  # the pod's default max_buffer_seconds


async def _streaming(endpoint: conftest.Endpoint, **headers: str) -> ws_client.ClientConnection:
    ws = await clients.connect(endpoint, **headers)
    await ws.send(kyutai_client.audio(np.zeros(clients.SECOND, dtype=np.float32)))
    await clients.used_slots_become(endpoint, 1, 10)
    return ws


async def test_a_clean_close_frees_the_slot(endpoint: conftest.Endpoint) -> None:
    ws = await _streaming(endpoint)
    await ws.close()
    await clients.used_slots_become(endpoint, 0, AT_ONCE_S)


async def test_a_clean_close_while_the_pod_holds_audio_frees_the_slot(
        endpoint: conftest.Endpoint) -> None:
    """Kyutai's file client closes as soon as its marker is back, while the pod still
    holds the silence that it sent to flush the marker: the slot is freed once the pod
    reaches the close behind that audio, as for any clean close, never kept for a
    resume (the router used to drop its link to the pod, which the pod read as lost)."""
    ws = await clients.connect(endpoint)
    speech = streams.random_speechlike(2.0, seed=6)
    flush = clients.with_marker(clients.chunked(speech, clients.FRAME), after_seconds=120)
    sender = asyncio.create_task(clients.send_all(ws, flush))  # far more than it steps
    try:                                                          # before the marker is back
        await kyutai_client.until_marker(ws, 0)
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
    await ws.close()
    await clients.used_slots_become(endpoint, 0, conftest.GRACE_S - 10)


async def test_a_clean_close_read_before_held_audio_frees_a_resumable_slot(
        endpoint: conftest.Endpoint) -> None:
    """A client that asked to resume sends twice the audio the pod buffers, then closes
    cleanly, all at once: the pod parses the close (and its server ends the connection)
    while it still holds that audio back, and its next send fails. The stream ended
    cleanly all the same, so the slot is freed, not kept for a resume (it was, in about
    1 of 8 runs of the test above)."""
    ws = await clients.connect(endpoint, asrpool_resumable="1")
    speech = streams.random_speechlike(2 * BUFFERED_S, seed=7)
    await clients.send_then_close(ws, [kyutai_client.audio(piece) for piece
                                       in np.split(speech, 2 * BUFFERED_S)])
    # Freed in about 1 s here; bounded as above, well under the grace, for loaded machines.
    await clients.used_slots_become(endpoint, 0, conftest.GRACE_S - 10)
    ws.transport.abort()


async def test_a_browser_close_without_a_code_frees_the_slot(
        endpoint: conftest.Endpoint) -> None:
    ws = await _streaming(endpoint)
    await clients.close_without_code(ws)
    await clients.used_slots_become(endpoint, 0, AT_ONCE_S)


async def test_a_dropped_connection_frees_the_slot(endpoint: conftest.Endpoint) -> None:
    ws = await _streaming(endpoint)
    ws.transport.abort()  # TCP reset, no close frame: a client that can never resume
    await clients.used_slots_become(endpoint, 0, AT_ONCE_S)


async def test_a_client_that_asked_to_resume_is_kept_and_resumes(
        endpoint: conftest.Endpoint) -> None:
    ws = await _streaming(endpoint, asrpool_resumable="1")
    assert ws.response is not None
    token = ws.response.headers["asrpool-resume-token"]
    ws.transport.abort()
    await asyncio.sleep(2.0)
    assert endpoint.used_slots() == 1  # held for the grace
    async with await clients.connect(endpoint, asrpool_resume_token=token) as again:
        await clients.send_all(again, clients.with_marker([]))
        await kyutai_client.until_marker(again, 0)
    await clients.used_slots_become(endpoint, 0, AT_ONCE_S)


async def test_a_silent_client_answering_pings_stays_until_the_idle_timeout(
        endpoint: conftest.Endpoint) -> None:
    """No audio, but pongs: kept past the no-frame timeout, then idle_timeout."""
    loop = asyncio.get_running_loop()
    async with await clients.connect(endpoint) as ws:
        started = loop.time()
        error = await kyutai_client.expect(ws, "Error", timeout=conftest.IDLE_S + 10)
        waited = loop.time() - started
    assert error["code"] == "idle_timeout"
    assert waited > conftest.PING_S + conftest.PONG_S + 1
    await clients.used_slots_become(endpoint, 0, AT_ONCE_S)


async def test_a_client_that_answers_no_ping_and_sends_nothing_is_dropped(
        endpoint: conftest.Endpoint) -> None:
    """Nothing at all from it (a vanished peer): gone after the ping timeout, long
    before the idle timeout."""
    ws = await clients.connect(endpoint)
    ws.transport.pause_reading()  # pings are never read, so never answered
    try:
        waited = await clients.used_slots_become(endpoint, 0, conftest.IDLE_S + 10)
        assert waited < conftest.IDLE_S - 1
    finally:
        ws.transport.abort()


async def test_a_client_that_sends_audio_but_reads_nothing_stays(
        endpoint: conftest.Endpoint) -> None:
    """As moshi-server, any frame is a sign of life: a client sending audio is kept
    though it reads nothing (its pongs never come)."""
    ws = await clients.connect(endpoint)
    ws.transport.pause_reading()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 2 * (conftest.PING_S + conftest.PONG_S)
    frame = kyutai_client.audio(np.zeros(clients.FRAME, dtype=np.float32))
    try:
        while loop.time() < deadline:
            await ws.send(frame)
            await asyncio.sleep(0.08)
        assert endpoint.used_slots() == 1
    finally:
        ws.transport.abort()
