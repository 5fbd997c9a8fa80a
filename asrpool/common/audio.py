"""Audio files in, 24 kHz mono float32 out; and the message schedule of Kyutai's file client."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from asrpool.common import oggopus, protocol
from asrpool.common.protocol import FRAME_SIZE, SAMPLE_RATE


class AudioFileError(ValueError):
    """An audio file that cannot be read; the message says why."""


class AudioTooLong(AudioFileError):
    """An audio file that holds more audio than allowed; found before it was decoded
    past the limit."""

    def __init__(self, seconds: float, limit: float) -> None:
        super().__init__(f"the body holds {seconds:.1f}+ s of audio, over the limit of "
                         f"{limit:g} s (max_upload_seconds)")


def load_audio(path: str | Path) -> NDArray[np.float32]:
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


def decode_audio_bytes(data: bytes, max_seconds: float | None = None) -> NDArray[np.float32]:
    """A whole WAV/FLAC/OGG/MP3 file's bytes to 24 kHz mono float32 (its first channel,
    as moshi-server's POST takes). Raises :class:`AudioFileError` saying why not, and
    :class:`AudioTooLong` once it finds more than ``max_seconds`` of audio: Opus is
    counted from its packets before it is decoded, other formats are decoded no further
    than the limit."""

    if not data:
        raise AudioFileError("the body is empty: send a WAV, FLAC, OGG or MP3 file")
    if data[:4] == b"OggS" and b"OpusHead" in data[:128]:
        if max_seconds is not None:
            seconds = oggopus.stream_samples(data) / oggopus.RATE
            if seconds > max_seconds:
                raise AudioTooLong(seconds, max_seconds)
        pcm = _decode_opus(data)
    else:
        pcm = _decode_file(data, max_seconds)
    if pcm.size == 0:
        raise AudioFileError("the body holds no audio")
    problem = protocol.sample_problem(pcm)
    if problem is not None:
        raise AudioFileError(f"the body's audio {problem}")
    return pcm


def _decode_opus(data: bytes) -> NDArray[np.float32]:
    import sphn

    try:
        pcm, rate = sphn.read_opus_bytes(data)  # symphonia has no Opus decoder
        pcm = sphn.resample(np.asarray(pcm, dtype=np.float32)[0], rate, SAMPLE_RATE)
    except Exception as exc:  # sphn raises plain exceptions for broken streams
        raise AudioFileError(f"the body is not a readable Ogg Opus file: {exc}") from exc
    return np.ascontiguousarray(pcm, dtype=np.float32)


def _decode_file(data: bytes, max_seconds: float | None) -> NDArray[np.float32]:
    with _body_file(data) as path:
        if max_seconds is None:
            return _decode_first_channel(path)
        return _decode_first_channel_within(path, max_seconds)


@contextlib.contextmanager
def _body_file(data: bytes) -> Iterator[str]:
    """A path to ``data`` for sphn, which reads only paths. On Linux an anonymous
    in-memory file (``memfd``) that goes with the process however it ends: a decoder
    killed at its deadline, or aborted by Rust at its memory limit, leaves nothing on
    the pod's disk, where a temporary file would stay (an upload's size each time)."""
    if not (hasattr(os, "memfd_create") and Path("/proc/self/fd").is_dir()):
        import tempfile

        with tempfile.NamedTemporaryFile(prefix="asrpool-upload-") as file:
            file.write(data)
            file.flush()
            yield file.name
        return
    descriptor = os.memfd_create("asrpool-upload", os.MFD_CLOEXEC)
    try:
        with open(descriptor, "wb", closefd=False) as file:
            file.write(data)
        yield f"/proc/self/fd/{descriptor}"
    finally:
        os.close(descriptor)


def _decode_first_channel(path: str) -> NDArray[np.float32]:
    import sphn

    try:
        data, _ = sphn.read(path, sample_rate=SAMPLE_RATE)
    except Exception as exc:  # sphn raises plain exceptions for unsupported formats
        raise _not_a_file(path, exc) from exc
    return _first_channel(data)


def _decode_first_channel_within(path: str, max_seconds: float) -> NDArray[np.float32]:
    """As :func:`_decode_first_channel` (the same samples), decoding at most a little
    past ``max_seconds``: a compressed file of silence cannot make it decode hours."""
    import sphn

    try:
        rate, pcm = _decode_up_to(path, max_seconds)
    except Exception as exc:  # sphn raises plain exceptions for unsupported formats
        raise _not_a_file(path, exc) from exc
    first = _first_channel(pcm)
    if first.size > max_seconds * rate:
        raise AudioTooLong(first.size / rate, max_seconds)
    if rate == SAMPLE_RATE:
        return first
    return np.ascontiguousarray(sphn.resample(first, rate, SAMPLE_RATE), dtype=np.float32)


def _first_channel(data: NDArray[Any]) -> NDArray[np.float32]:
    pcm = np.asarray(data, dtype=np.float32)
    return np.ascontiguousarray(pcm[0] if pcm.ndim == 2 else pcm)


def _not_a_file(path: str, exc: Exception) -> AudioFileError:
    reason = str(exc).replace(f'"{path}": ', "")
    return AudioFileError(f"the body is not a WAV, FLAC, OGG or MP3 file: {reason}")


def _decode_up_to(path: str, max_seconds: float) -> tuple[int, NDArray[Any]]:
    """The file's rate and its samples, up to a second past ``max_seconds``. sphn sets
    aside room for the whole span it is asked for, so it is first asked for the length
    the file declares; only a file that turns out longer is decoded again to the limit."""
    import sphn

    reader = sphn.FileReader(path)
    rate = int(reader.sample_rate)
    span = min(max_seconds, float(reader.duration_sec)) + 1.0
    pcm = np.asarray(reader.decode(0.0, span))
    if span < max_seconds + 1.0 and pcm.shape[-1] >= int(span * rate):
        pcm = np.asarray(sphn.FileReader(path).decode(0.0, max_seconds + 1.0))
    return rate, pcm


def kyutai_file_messages(
    pcm: NDArray[np.float32], marker_id: int = 0, chunk: int = FRAME_SIZE
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
