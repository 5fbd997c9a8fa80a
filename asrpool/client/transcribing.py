"""The importable Python client: a stream's words as they come, from an audio file or an
array of samples, through a router or straight to a pod.

    from asrpool.client import transcribing

    async for word in transcribing.words("wss://asr.example.com", "call.wav", api_key=KEY):
        print(f"{word.start:7.2f}  {word.text}")

It sends as Kyutai's file client does (a second of silence, the audio in 80 ms frames at
real time, silence to flush the model, a marker), and resumes by itself through a
dropped connection or a router that stops (:func:`streaming.stream_messages`: the
server says what it holds, and the audio goes on from there). A refusal raises the
error of its code (:mod:`asrpool.client.errors`: :class:`~errors.Busy`,
:class:`~errors.Unauthorized`, ...), all of them a :class:`~errors.StreamError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from asrpool.client import errors, streaming
from asrpool.common import audio, protocol

SAMPLE_RATE = protocol.SAMPLE_RATE
Source = str | Path | NDArray[np.floating[Any]]


@dataclasses.dataclass(frozen=True)
class Word:
    """A word, when the model heard it begin (seconds from the start of the audio)."""

    text: str
    start: float


def samples_of(source: Source, sample_rate: int = SAMPLE_RATE) -> NDArray[np.float32]:
    """Mono float samples at 24 kHz: a file decoded (WAV, FLAC, MP3, ...), or an array
    of ``sample_rate`` samples resampled."""
    if isinstance(source, str | Path):
        try:
            return audio.load_audio(source)
        except audio.AudioFileError as exc:
            raise errors.StreamError(str(exc)) from exc
    pcm = np.asarray(source, dtype=np.float32)
    if pcm.ndim != 1:
        raise errors.StreamError(f"expected mono samples (one dimension), got shape {pcm.shape}")
    if sample_rate != SAMPLE_RATE:
        import sphn

        pcm = np.asarray(sphn.resample(pcm, sample_rate, SAMPLE_RATE), dtype=np.float32)
    return pcm


async def words(url: str, source: Source, *, api_key: str | None = None,
                sample_rate: int = SAMPLE_RATE, rtf: float = 1.0,
                timeout: float = 60.0) -> AsyncIterator[Word]:
    """The words of ``source`` as the platform at ``url`` hears them (``ws[s]://HOST``, a
    router's ``/pools/POOL/api/asr-streaming``, or a pod), sent at ``rtf`` times real
    time. Raises :class:`errors.StreamError` (one kind per refusal)."""
    pcm = samples_of(source, sample_rate)
    heard: asyncio.Queue[Word | None] = asyncio.Queue()

    def on_message(message: dict[str, Any]) -> None:
        if message.get("type") == "Word":
            heard.put_nowait(Word(str(message.get("text", "")), _start(message)))

    messages = audio.kyutai_file_messages(pcm, marker_id=streaming.MARKER_ID)
    stream = asyncio.create_task(streaming.stream_messages(
        url, messages, rtf=rtf, api_key=api_key, on_message=on_message, timeout=timeout))
    stream.add_done_callback(lambda _: heard.put_nowait(None))
    try:
        while (word := await heard.get()) is not None:
            yield word
        result = stream.result()  # its error, if it ended with one
        if not result.marker_seen:
            raise errors.StreamError("the connection closed before the transcript was "
                                     "complete")
    finally:
        stream.cancel()
        await asyncio.gather(stream, return_exceptions=True)


def _start(message: dict[str, Any]) -> float:
    """The word's time in the caller's audio: Kyutai's file client sends a second of
    silence first."""
    return round(float(message.get("start_time") or 0.0) - 1.0, 3)
