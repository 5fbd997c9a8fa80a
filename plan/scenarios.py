"""The traffic a plan simulates: generated Poisson arrivals over a daily curve, or a
replayed trace of start times and durations.

Either way the arrivals come in chunks of two sorted lists (start times, durations in
seconds), so that a simulated day of millions of sessions never sits in memory whole.
Bad input raises :class:`PlanError` with one line that names the value or the line.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

DAY = 86_400.0
CHUNK_SECONDS = 3_600.0  # arrivals are generated one simulated hour at a time
TRACE_COLUMNS = ("start_s", "duration_s")

Chunk = tuple[list[float], list[float]]  # start times (sorted), durations


class PlanError(ValueError):
    """Input a plan cannot run with; the message says which value or line, in one line."""


def positive(name: str, value: float) -> float:
    """``value`` if it is a finite number above zero, else a :class:`PlanError`."""
    if not (math.isfinite(value) and value > 0):
        raise PlanError(f"{name} must be a positive number, got {value:g}")
    return value


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Poisson arrivals whose rate follows a daily curve; lognormal session durations.

    The rate is ``peak_rate`` at 16:00 and ``trough`` times that at 04:00, a raised
    cosine in between (``trough`` 1 is a flat rate). The simulated day starts at 00:00
    with, when ``warm``, the streams a day like it leaves open at midnight: as many as
    arrive in a mean duration (Poisson), each with the rest of a length-biased session
    (for a lognormal, the same law with its log-mean raised by sigma squared).
    """

    peak_rate: float  # arrivals per second at the daily peak
    mean_duration: float  # seconds
    duration_sigma: float  # of the duration's logarithm
    hours: float
    trough: float = 0.2
    seed: int = 0
    warm: bool = True  # start with the streams of the night before already open


    def __post_init__(self) -> None:
        positive("the arrival rate", self.peak_rate)
        positive("the mean session duration", self.mean_duration)
        positive("--hours", self.hours)
        if not (math.isfinite(self.duration_sigma) and self.duration_sigma >= 0):
            raise PlanError(f"--duration-sigma must be zero or more, got {self.duration_sigma:g}")
        if not 0 <= self.trough <= 1:
            raise PlanError(f"--trough must be between 0 and 1, got {self.trough:g}")

    @property
    def horizon(self) -> float:
        return self.hours * 3600.0

    def rate_at(self, seconds: NDArray[np.float64]) -> NDArray[np.float64]:
        phase = 2 * np.pi * (seconds - 4 * 3600.0) / DAY
        return self.peak_rate * (self.trough + (1 - self.trough) * (1 - np.cos(phase)) / 2)

    @property
    def open_at_start(self) -> float:
        """Streams open at 00:00 on average, when ``warm``."""
        return float(self.rate_at(np.zeros(1))[0]) * self.mean_duration if self.warm else 0.0

    def sessions(self) -> tuple[list[float], Iterator[Chunk]]:
        """The durations left of the streams open at the start, and the arrivals."""
        rng = np.random.default_rng(self.seed)
        return (self._open(rng) if self.warm else []), self._chunks(rng)

    def _chunks(self, rng: np.random.Generator) -> Iterator[Chunk]:
        for start in np.arange(0.0, self.horizon, CHUNK_SECONDS).tolist():
            yield self._chunk(rng, start, min(start + CHUNK_SECONDS, self.horizon))

    def _chunk(self, rng: np.random.Generator, start: float, end: float) -> Chunk:
        """Piecewise-constant rate over each simulated minute of [start, end)."""
        edges = np.arange(start, end, 60.0)
        widths = np.minimum(edges + 60.0, end) - edges
        counts = rng.poisson(self.rate_at(edges + widths / 2) * widths)
        starts = np.repeat(edges, counts) + rng.random(counts.sum()) * np.repeat(widths, counts)
        starts.sort()
        return starts.tolist(), self.durations(rng, len(starts)).tolist()

    def _open(self, rng: np.random.Generator) -> list[float]:
        n = int(rng.poisson(self.open_at_start))
        biased = self.durations(rng, n, self.duration_sigma**2)
        return list((biased * (1.0 - rng.random(n))).tolist())

    def durations(self, rng: np.random.Generator, n: int,
                  shift: float = 0.0) -> NDArray[np.float64]:
        mu = math.log(self.mean_duration) - self.duration_sigma**2 / 2 + shift
        return rng.lognormal(mu, self.duration_sigma, n)


@dataclasses.dataclass(frozen=True)
class Trace:
    """Sessions replayed from a CSV file (columns ``start_s`` and ``duration_s``)."""

    starts: list[float]
    durations: list[float]

    @property
    def horizon(self) -> float | None:
        return None  # until the last session ends

    @property
    def open_at_start(self) -> float:
        return 0.0

    def sessions(self) -> tuple[list[float], Iterator[Chunk]]:
        return [], iter([(self.starts, self.durations)])


def read_trace(path: Path) -> Trace:
    """Read and check a trace: a header naming the columns, then rows in start order."""
    try:
        with path.open(newline="") as handle:
            return _parse_trace(path.name, csv.reader(handle))
    except OSError as exc:
        raise PlanError(f"cannot read the trace {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise PlanError(f"{path.name} is not a text CSV file") from exc


def _parse_trace(name: str, rows: Iterator[list[str]]) -> Trace:
    header = [cell.strip() for cell in next(rows, [])]
    missing = [column for column in TRACE_COLUMNS if column not in header]
    if missing:
        raise PlanError(f"{name} line 1: the header must name the columns "
                        f"{', '.join(TRACE_COLUMNS)} (missing {', '.join(missing)})")
    at = [header.index(column) for column in TRACE_COLUMNS]
    starts: list[float] = []
    durations: list[float] = []
    for line, row in enumerate(rows, start=2):
        if not any(cell.strip() for cell in row):
            continue
        start, duration = (_cell(name, line, row, index, column)
                           for index, column in zip(at, TRACE_COLUMNS, strict=True))
        _check_row(name, line, start, duration, starts[-1] if starts else 0.0)
        starts.append(start)
        durations.append(duration)
    if not starts:
        raise PlanError(f"{name}: the trace has no sessions")
    return Trace(starts, durations)


def _cell(name: str, line: int, row: list[str], index: int, column: str) -> float:
    text = row[index].strip() if index < len(row) else ""
    try:
        value = float(text)
    except ValueError:
        raise PlanError(f"{name} line {line}: {column} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise PlanError(f"{name} line {line}: {column} {text!r} is not a finite number")
    return value


def _check_row(name: str, line: int, start: float, duration: float, previous: float) -> None:
    if start < 0:
        raise PlanError(f"{name} line {line}: start_s {start:g} is negative")
    if start < previous:
        raise PlanError(f"{name} line {line}: start_s {start:g} is before the previous "
                        f"line's {previous:g} (sort the trace by start time)")
    if duration <= 0:
        raise PlanError(f"{name} line {line}: duration_s {duration:g} must be positive")
