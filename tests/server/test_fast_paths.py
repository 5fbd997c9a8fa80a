"""A pod on uvicorn takes ``Audio`` in its protocol's own callback and sends results from
the step's callback (``framing.WebSocketProtocol.fast_reader`` and ``send_now``), and
leaves everything else to its reader and writer tasks. Interleaved, the two ways keep
the stream's order: a burst of audio with markers between the frames (the markers go
the reader's way, the audio around them the callback's) gets exactly what the same
messages give fed one by one to an engine in-process.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from asrpool.server import engine, events, models
from tests.server import conftest
from tests.support import kyutai_client, servers

FRAME = kyutai_client.FRAME_SIZE
LAST = 999


def _burst(seconds: float, seed: int) -> list[dict[str, Any]]:
    """Frames of speech, a marker after every seventh, then silence and the last marker."""
    pcm = conftest.speechlike(seconds, seed=seed)
    out: list[dict[str, Any]] = []
    for i in range(len(pcm) // FRAME):
        out.append({"type": "Audio", "pcm": pcm[i * FRAME:(i + 1) * FRAME]})
        if i % 7 == 3:
            out.append({"type": "Marker", "id": i})
    silence = np.zeros(FRAME, dtype=np.float32)
    out += [{"type": "Audio", "pcm": silence}] * 4
    out.append({"type": "Marker", "id": LAST})
    return out + [{"type": "Audio", "pcm": silence}] * 60


def _reference(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages in slot 0 of an engine of the pod's size, one torch thread as the
    pod, up to the last marker's return."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    said: list[events.Event] = []
    samples = np.zeros(0, dtype=np.float32)
    try:
        with engine.BatchedEngine(models.load_model("tiny"), conftest.BATCH) as eng:
            eng.reset_slot(0)
            for message in messages:
                if message["type"] == "Marker":
                    eng.add_marker(0, message["id"], len(samples) // FRAME)
                    continue
                samples = np.concatenate([samples, message["pcm"]])
                while len(samples) >= FRAME:
                    said += eng.step({0: samples[:FRAME]}).events[0]
                    samples = samples[FRAME:]
    finally:
        torch.set_num_threads(threads)
    out = [events.to_message(event) for event in said]
    last = next(i for i, m in enumerate(out) if m == {"type": "Marker", "id": LAST})
    return out[:last + 1]


def _shown(message: dict[str, Any]) -> tuple[Any, ...]:
    """What a message says, but what stays buffered (a matter of timing)."""
    return tuple(sorted((key, value) for key, value in message.items()
                        if key not in ("buffered_pcm", "received_at")))


async def test_a_burst_of_audio_and_markers_gets_the_engines_results_in_order(
        shared_server: servers.ServerProcess) -> None:
    messages = _burst(6.0, seed=31)
    async with await kyutai_client.connect(shared_server.ws_url) as ws:
        await kyutai_client.expect(ws, "Ready")
        for message in messages:  # as fast as the socket takes them: many per read
            await ws.send(kyutai_client.pack(message))
        got = await kyutai_client.until_marker(ws, LAST, timeout=120)
    expected = _reference(messages)
    assert sum(m["type"] == "Marker" for m in expected) == 12  # not vacuous
    assert [_shown(m) for m in got] == [_shown(m) for m in expected]
