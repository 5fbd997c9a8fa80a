"""``POST /api/asr-streaming``: a whole file in, moshi-server's Word/EndWord list out.

As moshi-server's batched ASR does: the body is decoded (any rate, resampled to
24 kHz, its first channel), a slot is taken for the length of the request (waiting for
one while the pod is full, up to a bound), the audio is fed as fast as the engine takes
it, then ``Marker{id:0}`` and 10 s of silence; every ``Word``, ``EndWord`` and ``Error``
up to the marker is the answer, as a JSON list of ``{"type": ...}`` maps.

The decode runs in a child process within the pod's limits (:mod:`decoding`). A 503
means the pod took no slot for the request (busy, draining), so a router may send it
elsewhere; once the audio is in a slot, a failure is a 500 and is not retried. A client
that goes away frees its slot at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import numpy as np
from numpy.typing import NDArray
from starlette import requests

from asrpool.common import bodies, protocol
from asrpool.server import decoding, handles, outcomes, pods

FLUSH_SAMPLES = 10 * protocol.SAMPLE_RATE  # moshi-server's 10 s of silence after the marker
_CHUNK = protocol.SAMPLE_RATE  # fed one second at a time, each when there is room
_SLOT_WAIT_SECONDS = 30.0
_SLOT_POLL_SECONDS = 0.1
_KEPT = {"Word", "EndWord", "Error"}


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def transcribe(pod: pods.Pod, request: requests.Request) -> list[dict[str, Any]]:
    """Raises :class:`Refused` (400 not audio; 413 too large, too long or too costly to
    decode; 503 no slot: busy or draining; 500 stopped after it began; 499 the client
    went away)."""
    try:
        body = await bodies.read_limited(request, pod.settings.max_upload_bytes,
                                         pod.settings.body_pace)
    except bodies.TooLarge as exc:
        raise Refused(413, str(exc)) from exc
    except bodies.TooSlow as exc:
        raise Refused(408, str(exc)) from exc
    gone = asyncio.create_task(bodies.disconnected(request))
    try:
        pcm = await bodies.unless_gone(gone, decoding.decode(body, pod.settings.decode_limits))
        handle = await bodies.unless_gone(gone, _slot(pod))
        return await _transcribed(handle, pcm, gone)
    except decoding.Refused as exc:
        raise Refused(exc.status, exc.message) from exc
    except bodies.ClientGone as exc:
        raise Refused(499, str(exc)) from exc
    finally:
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)


async def _transcribed(handle: handles.Handle, pcm: NDArray[np.float32],
                       gone: asyncio.Task[None]) -> list[dict[str, Any]]:
    kick = handle.attach(resumed=False)
    feeder = asyncio.create_task(_feed(handle, pcm))
    collector = asyncio.create_task(_collect(handle))
    try:
        waited: set[asyncio.Future[Any]] = {collector, kick, gone}
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        if gone.done():
            raise bodies.ClientGone
        if not collector.done():
            raise Refused(500, f"the pod stopped transcribing: {_reason(kick.result())}")
        return collector.result()
    finally:
        handle.detach()
        for task in (feeder, collector):
            task.cancel()
        await asyncio.gather(feeder, collector, return_exceptions=True)
        handle.finish(outcomes.Closed())


def _reason(outcome: outcomes.Outcome) -> str:
    return outcome.message if isinstance(outcome, outcomes.Failed) else "stream ended"


async def _slot(pod: pods.Pod) -> handles.Handle:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _SLOT_WAIT_SECONDS
    while True:
        got = pod.open(resumable=False)
        if isinstance(got, handles.Handle):
            return got
        if got.code != protocol.ErrorCode.BUSY or loop.time() > deadline:
            pod.count_error(got.code)
            raise Refused(503, got.message)
        await asyncio.sleep(_SLOT_POLL_SECONDS)


async def _feed(handle: handles.Handle, pcm: NDArray[np.float32]) -> None:
    for start in range(0, len(pcm), _CHUNK):
        await handle.room()
        handle.push_audio(pcm[start:start + _CHUNK])
    await handle.push({"type": "Marker", "id": 0})
    for _ in range(FLUSH_SAMPLES // _CHUNK):
        await handle.room()
        handle.push_audio(np.zeros(_CHUNK, dtype=np.float32))


async def _collect(handle: handles.Handle) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        message = msgpack.unpackb(await handle.next_output(), raw=False)
        handle.sent()
        if message["type"] == "Marker":
            return out
        if message["type"] in _KEPT:
            out.append(message)
