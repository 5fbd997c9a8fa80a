"""Audio files in, 24 kHz mono float32 out; and the message schedule of Kyutai's file client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from asrpool.common.protocol import FRAME_SIZE, SAMPLE_RATE


class AudioFileError(ValueError):
    """An audio file that cannot be read; the message says why."""


def load_audio(path: str | Path) -> np.ndarray:
    """Read WAV/FLAC/MP3/OGG at any rate, mix to mono and resample to 24 kHz."""
    import sphn

    path = Path(path)
    if not path.is_file():
        raise AudioFileError(f"no such audio file: {path}")
    try:
        data, _ = sphn.read(str(path), sample_rate=SAMPLE_RATE)
    except Exception as exc:  # sphn raises plain exceptions for unsupported formats
        raise AudioFileError(f"cannot decode {path}: {exc}") from exc
    pcm = np.asarray(data, dtype=np.float32)
    pcm = pcm.mean(axis=0) if pcm.ndim == 2 else pcm
    if pcm.size == 0:
        raise AudioFileError(f"{path} holds no audio")
    return np.ascontiguousarray(pcm)


def kyutai_file_messages(
    pcm: np.ndarray, marker_id: int = 0, chunk: int = FRAME_SIZE
) -> Iterator[dict[str, Any]]:
    """What Kyutai's file client sends: 1 s of silence, the audio in 80 ms chunks,
    5 s of silence, a marker, then 1 s silences (35 at most) to flush the model."""
    second = np.zeros(SAMPLE_RATE, dtype=np.float32)
    yield {"type": "Audio", "pcm": second}
    for start in range(0, len(pcm), chunk):
        yield {"type": "Audio", "pcm": pcm[start:start + chunk]}
    for _ in range(5):
        yield {"type": "Audio", "pcm": second}
    yield {"type": "Marker", "id": marker_id}
    for _ in range(35):
        yield {"type": "Audio", "pcm": second}
