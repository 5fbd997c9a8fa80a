"""A microphone's audio as a stream's frames (``asrpool stream --mic``), through
``sounddevice`` (PortAudio): 24 kHz mono float samples in 80 ms frames, handed from the
audio thread to the event loop as they are recorded.

Where there is no sound input (no PortAudio, no device), :func:`problem` says so in one
line before anything starts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from asrpool.common import protocol

FRAME = protocol.FRAME_SIZE
MAX_QUEUED_FRAMES = 250  # 20 s: a loop that falls this far behind drops the oldest
POLL_SECONDS = 0.2  # how soon a stop is seen without audio coming


def problem() -> str | None:
    """Why the microphone cannot be recorded here, or None."""
    try:
        import sounddevice

        sounddevice.query_devices(kind="input")
    except (ImportError, OSError, ValueError) as exc:  # no PortAudio, no input device
        return f"--mic needs a sound input device: {exc}"
    return None


async def frames(stop: asyncio.Event, device: int | str | None = None
                 ) -> AsyncIterator[NDArray[np.float32]]:
    """The default (or ``device``) input's audio, one 80 ms frame at a time, until
    ``stop`` is set (then what was recorded before it, and no more)."""
    import sounddevice

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[NDArray[np.float32]] = asyncio.Queue(MAX_QUEUED_FRAMES)

    def recorded(data: NDArray[np.float32], count: int, time: Any, status: Any) -> None:
        loop.call_soon_threadsafe(_put_newest, queue, data[:, 0].copy())

    with sounddevice.InputStream(samplerate=protocol.SAMPLE_RATE, channels=1,
                                 dtype="float32", blocksize=FRAME, device=device,
                                 callback=recorded):
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                yield await asyncio.wait_for(queue.get(), POLL_SECONDS)
    while not queue.empty():
        yield queue.get_nowait()


def _put_newest(queue: asyncio.Queue[NDArray[np.float32]], frame: NDArray[np.float32]) -> None:
    if queue.full():
        queue.get_nowait()
    queue.put_nowait(frame)
