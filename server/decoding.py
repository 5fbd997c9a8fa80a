"""Uploaded files decoded in a child process, bounded in memory, time and audio length.

sphn holds the GIL while it decodes, so a decode in a thread still stalls the pod's
event loop (its heartbeat with it) for as long as the file takes; and a few KB of
compressed silence can decode to hours. So each upload is decoded by its own short-lived
``python -m asrpool.server.decoding``: the body on its standard input, raw float32
samples (24 kHz mono) on its standard output. The child limits its own address space
(``RLIMIT_AS``), makes itself the first process the kernel's OOM killer takes (so a
pod's memory limit never costs it the server) and lowers its own priority (so the
engine keeps the CPU) before it reads anything, decodes no further than ``max_seconds``
(:func:`asrpool.common.audio.decode_audio_bytes`), and is killed at the deadline. Its
exit code says what went wrong; whatever happens to it is that request's answer (400,
413 or 500), never the pod's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import resource
import sys
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

NICENESS = 10  # the child's scheduling priority, below the pod's
NOT_AUDIO = 2  # exit codes of the child, each with its reason on standard error
TOO_LONG = 3
OUT_OF_MEMORY = 4
_STATUS = {NOT_AUDIO: 400, TOO_LONG: 413, OUT_OF_MEMORY: 413}
_RUST_OUT_OF_MEMORY = "memory allocation of"  # Rust's abort message (sphn's decoders)
_ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                      "MKL_NUM_THREADS")}


@dataclasses.dataclass(frozen=True)
class Limits:
    max_seconds: float
    memory_bytes: int
    timeout_seconds: float


class Refused(Exception):
    """The upload cannot be decoded within its limits: its HTTP status and reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def decode(body: bytes, limits: Limits) -> NDArray[np.float32]:
    """The body's audio, 24 kHz mono float32; raises :class:`Refused`."""
    child = await asyncio.create_subprocess_exec(
        # -P: the working directory is not put on sys.path (a checkout's operator/
        # folder would hide the standard library's operator module).
        sys.executable, "-P", "-m", "asrpool.server.decoding", repr(limits.max_seconds),
        str(limits.memory_bytes), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **_ONE_THREAD})
    try:
        out, err = await asyncio.wait_for(child.communicate(body), limits.timeout_seconds)
    except TimeoutError:
        raise Refused(413, f"the body took longer than {limits.timeout_seconds:g} s to "
                           "decode (decode_timeout_seconds)") from None
    finally:
        if child.returncode is None:  # the deadline, or the request was cancelled
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()
    if child.returncode == 0:
        return np.frombuffer(out, dtype="<f4")
    raise _refusal(child.returncode, err.decode(errors="replace").strip(), limits)


def _refusal(code: int | None, reason: str, limits: Limits) -> Refused:
    if code in _STATUS:
        return Refused(_STATUS[code], reason.splitlines()[-1] if reason else "refused")
    if _RUST_OUT_OF_MEMORY in reason:
        return Refused(413, _memory_reason(limits))
    last = reason.splitlines()[-1] if reason else f"exit code {code}"
    return Refused(500, f"the decoder failed: {last}")


def _memory_reason(limits: Limits) -> str:
    return (f"decoding the body needs more than {limits.memory_bytes >> 20} MiB "
            "(decode_memory_bytes)")


def main(argv: list[str]) -> int:
    max_seconds, memory_bytes = float(argv[0]), int(argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    _first_to_go()
    _behind_the_pod()
    from asrpool.common import audio

    try:
        body = sys.stdin.buffer.read()
        pcm = audio.decode_audio_bytes(body, max_seconds)
        sys.stdout.buffer.write(np.ascontiguousarray(pcm, dtype="<f4").tobytes())
    except audio.AudioTooLong as exc:
        print(exc, file=sys.stderr)
        return TOO_LONG
    except audio.AudioFileError as exc:
        print(exc, file=sys.stderr)
        return NOT_AUDIO
    except MemoryError:
        limits = Limits(max_seconds, memory_bytes, 0.0)
        print(_memory_reason(limits), file=sys.stderr)
        return OUT_OF_MEMORY
    return 0


def _behind_the_pod() -> None:
    """Every upload's decode yields the CPU to the pod's engine and event loop: a
    few bombs decoding at once on a small node would otherwise slow every stream."""
    os.nice(NICENESS - os.nice(0))


def _first_to_go() -> None:
    """If the pod's memory runs out (its container's limit, below this child's own), the
    kernel kills this decoder, not the server (any process may raise its own score)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text("1000")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
