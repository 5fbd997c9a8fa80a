"""The paced engine (``serve --paced-engine FILE``): a stand-in for the model's forward.

FILE is a ``bench capacity`` result (``bench/results/capacity-*.json``): the model it
measured and, per batch tried, ``engine_p50_ms``, the median time of the engine's whole
step (``engine_loop.run_batch`` around ``Engine.step``: frames into the rows, the
forward, the words decoded) without the pod's host work around it (audio intake, result
delivery, sockets). A pod with a paced engine runs all of that host work for real, so
each paced step takes ``engine_p50_ms`` (not ``step_p50_ms``, which counts the host work
a second time): the stand-in does the engine's own work on the rows (``stepping.Engine``)
and sleeps what remains of the measured time, letting the GIL go as a GPU's engine does
while its kernels run. The time is that of the pod's batch size whatever the number of
busy slots (CUDA graphs run every row), from the measured batches by
:func:`step_ms`; with CUDA graphs measured on and off, the rows with graphs on (as a pod
runs).

It answers as the measured model would (``answers``): one ``Step`` per frame with as
many ``prs`` as that model's extra heads give (which carry no meaning here), and every
``WORD_EVERY`` steps of a stream a pseudo-word and its end, through the stream's own
``events.WordDecoder``, so words, their stream-relative times and markers come after the
model's delay exactly as with the model. It is a rehearsal of the host path (router,
ingress, CPU nodes, the pod itself) at GPU scale without a GPU, never a model: it loads
no weights and imports no torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
from numpy.typing import NDArray

from asrpool.server import answers, events, stepping

WORD_EVERY = 10  # steps of a stream per pseudo-word (0.8 s)
FIRST_WORD_TOKEN = 4  # text tokens 0 and 3 are the end of padding and padding
WORDS = ("alfa", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliett", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
         "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu")


class ProfileError(ValueError):
    """A paced engine's file that cannot be used; the message names it and says why."""


@dataclasses.dataclass(frozen=True)
class Profile:
    """What a ``bench capacity`` file says the paced engine needs."""

    model: str
    answers: answers.Answers
    measured_on: str  # the device that ran the benchmark
    points: tuple[tuple[int, float], ...]  # (batch, engine ms), by batch


@dataclasses.dataclass(frozen=True)
class Pace:
    """What a paced engine stands in for, as the pod tells it (its ready line,
    ``/api/modules_info``, ``asr_paced_engine``)."""

    model: str
    measured_on: str
    step_ms: float  # each step's, at the pod's batch size

    @property
    def label(self) -> str:
        return f"{self.model} ({self.measured_on} bench capacity)"


def step_ms(points: Sequence[tuple[int, float]], batch_size: int) -> float:
    """The step time of ``batch_size`` from measured ``(batch, ms)`` points (by batch,
    each batch once): linear between two measured batches; beyond the largest, the line
    through the last two (never below the largest's time); below the smallest, its time
    scaled down in proportion (as beyond the largest with one point only)."""
    smallest, largest = points[0], points[-1]
    if batch_size <= smallest[0] or len(points) == 1:
        return smallest[1] * batch_size / smallest[0]
    if batch_size >= largest[0]:
        return max(largest[1], _on_line(points[-2], largest, batch_size))
    upper = next(i for i, (batch, _) in enumerate(points) if batch >= batch_size)
    return _on_line(points[upper - 1], points[upper], batch_size)


def _on_line(a: tuple[int, float], b: tuple[int, float], batch_size: int) -> float:
    return a[1] + (b[1] - a[1]) * (batch_size - a[0]) / (b[0] - a[0])


def read_profile(path: str | Path) -> Profile:
    """The file's model and measured batches; :class:`ProfileError` names the file and
    what is wrong with it."""
    try:
        return _profile(_read_json(Path(path)))
    except ProfileError as exc:
        raise ProfileError(f"paced engine file {path}: {exc}") from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError("no such file") from None
    except OSError as exc:
        raise ProfileError(f"cannot be read ({exc.strerror})") from None
    except ValueError as exc:  # not JSON, or not text
        raise ProfileError(f"is not JSON ({exc})") from None


def _profile(data: Any) -> Profile:
    if not isinstance(data, dict):
        raise ProfileError("holds no bench capacity result (a JSON object)")
    if data.get("benchmark", "capacity") != "capacity":
        raise ProfileError(f"is a {data['benchmark']!r} benchmark, not bench capacity")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise ProfileError("names no model")
    said = answers.of(model)
    if said is None:
        raise ProfileError(f"measured model {model!r}, which the paced engine cannot answer "
                           f"as (it knows {', '.join(answers.known())})")
    return Profile(model, said, _measured_on(data), _points(data.get("batches")))


def _measured_on(data: dict[str, Any]) -> str:
    name = data.get("device_name") or data.get("device")
    return str(name) if name else "an unnamed device"


def _points(batches: Any) -> tuple[tuple[int, float], ...]:
    """(batch, engine ms) of the measured batches: the rows with CUDA graphs on where
    there are any; the batches that did not fit in memory measured nothing."""
    if not isinstance(batches, list) or not batches:
        raise ProfileError("has no batches")
    if not all(isinstance(row, dict) for row in batches):
        raise ProfileError("has a batch that is not a JSON object")
    rows = [row for row in batches if row.get("cuda_graphs") is True] or batches
    points = [_point(row) for row in rows if row.get("oom") is not True]
    if not points:
        raise ProfileError("has no measured batch (none fit in memory)")
    return _one_per_batch(points)


def _point(row: dict[str, Any]) -> tuple[int, float]:
    batch = row.get("batch_size")
    if not _is_number(batch) or batch != int(batch) or batch < 1:
        raise ProfileError(f"has a batch whose batch_size is {batch!r}, not a whole number "
                           "of at least 1")
    ms = row.get("engine_p50_ms")
    if not _is_number(ms):
        raise ProfileError(f"has a batch of {int(batch)} without a number for engine_p50_ms")
    if not 0 < ms < math.inf:
        raise ProfileError(f"has a batch of {int(batch)} whose engine_p50_ms is {ms}, "
                           "not a positive time")
    return int(batch), float(ms)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def _one_per_batch(points: list[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """By batch; a batch measured more than once gets the mean of its times."""
    times: dict[int, list[float]] = {}
    for batch, ms in points:
        times.setdefault(batch, []).append(ms)
    return tuple((batch, sum(ms) / len(ms)) for batch, ms in sorted(times.items()))


class PacedEngine(stepping.Engine):
    """Each step takes the measured time of the pod's batch size; see the module."""

    def __init__(self, profile: Profile, batch_size: int) -> None:
        super().__init__(profile.model, batch_size, profile.answers.delay, detokenize,
                         profile.answers.extra_heads > 0)
        self.pace = pace = Pace(profile.model, profile.measured_on,
                                step_ms(profile.points, batch_size))
        self._seconds = pace.step_ms / 1e3
        self._heads = profile.answers.extra_heads
        self._codes = np.zeros((batch_size, 0), dtype=np.int64)  # no audio codes

    def step(self, frames: Mapping[int, NDArray[np.float32]],
             masked_audio: NDArray[np.floating[Any]] | None = None,
             checked: bool = False) -> stepping.StepResult:
        started = time.monotonic()
        result = super().step(frames, masked_audio, checked)
        if frames:
            _sleep_until(started + self._seconds)
        return result

    def _forward(self, slots: list[int]) -> stepping.Forwarded:
        tokens = np.full(self.batch_size, events.PADDING, dtype=np.int64)
        prs = np.zeros((self.batch_size, self._heads), dtype=np.float32)
        for slot in slots:
            steps = self.decoders[slot].step_idx  # of this stream, before this one
            tokens[slot] = text_token(steps)
            prs[slot] = (steps % WORD_EVERY) / WORD_EVERY
        return tokens, prs, self._codes

    def _reset_rows(self, rows: list[int]) -> None:
        """No state but the rows' decoders, which ``stepping.Engine`` resets."""

    def state_nbytes(self) -> int:
        return self._pcm.nbytes

    def close(self) -> None:
        """Nothing to let go of: no model, no device."""


def text_token(steps: int) -> int:
    """What a stream that has run ``steps`` steps says next: padding, then one word
    token and the end of padding (which closes the word) every ``WORD_EVERY`` steps."""
    phase = steps % WORD_EVERY
    if phase == WORD_EVERY - 2:
        return FIRST_WORD_TOKEN + (steps // WORD_EVERY) % len(WORDS)
    return events.END_OF_PADDING if phase == WORD_EVERY - 1 else events.PADDING


def detokenize(tokens: list[int]) -> str:
    return " ".join(WORDS[token - FIRST_WORD_TOKEN] for token in tokens)


def build(path: str | Path, batch_size: int) -> PacedEngine:
    return PacedEngine(read_profile(path), batch_size)


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
