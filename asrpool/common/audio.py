"""Audio files in, 24 kHz mono float32 out; and the message schedule of Kyutai's file client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from asrpool.common import protocol
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


def decode_audio_bytes(data: bytes) -> np.ndarray:
    """A whole WAV/FLAC/OGG/MP3 file's bytes to 24 kHz mono float32 (its first channel,
    as moshi-server's POST takes). Raises :class:`AudioFileError` saying why not."""

    if not data:
        raise AudioFileError("the body is empty: send a WAV, FLAC, OGG or MP3 file")
    if data[:4] == b"OggS" and b"OpusHead" in data[:128]:
        pcm = _decode_opus(data)
    else:
        pcm = _decode_file(data)
    if pcm.size == 0:
        raise AudioFileError("the body holds no audio")
    problem = protocol.sample_problem(pcm)
    if problem is not None:
        raise AudioFileError(f"the body's audio {problem}")
    return pcm


def _decode_opus(data: bytes) -> np.ndarray:
    import sphn

    try:
        pcm, rate = sphn.read_opus_bytes(data)  # symphonia has no Opus decoder
        pcm = sphn.resample(np.asarray(pcm, dtype=np.float32)[0], rate, SAMPLE_RATE)
    except Exception as exc:  # sphn raises plain exceptions for broken streams
        raise AudioFileError(f"the body is not a readable Ogg Opus file: {exc}") from exc
    return np.ascontiguousarray(pcm, dtype=np.float32)


def _decode_file(data: bytes) -> np.ndarray:
    import tempfile

    with tempfile.NamedTemporaryFile(prefix="asrpool-upload-") as file:
        file.write(data)
        file.flush()
        return _decode_first_channel(file.name)


def _decode_first_channel(path: str) -> np.ndarray:
    import sphn

    try:
        data, _ = sphn.read(path, sample_rate=SAMPLE_RATE)
    except Exception as exc:  # sphn raises plain exceptions for unsupported formats
        reason = str(exc).replace(f'"{path}": ', "")
        raise AudioFileError(f"the body is not a WAV, FLAC, OGG or MP3 file: {reason}") from exc
    pcm = np.asarray(data, dtype=np.float32)
    return np.ascontiguousarray(pcm[0] if pcm.ndim == 2 else pcm)


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
