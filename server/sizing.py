"""``serve --batch-size auto``: the pod measures its own engine and serves what keeps real time.

How many streams a GPU holds depends on the model, the device, its memory, the dtype and
the context, and nobody should have to guess it. With ``--batch-size auto`` the pod, at
start-up and before it listens, measures its engine on its own device: engines of growing
batches (1, 2, 4, ... doubling until a batch misses the budget or does not fit in memory,
then halving the gap to within :data:`RESOLUTION`), each stepped :data:`STEPS` times with
every row busy after :data:`WARMUP` steps (CUDA graphs captured, caches warm). A batch
whose median step is within the budget but whose slowest is not is tried again (up to
:data:`RETRIES` times) and its fastest run counts: other work on the machine only ever
adds time, while a batch that is really too large misses every run. It serves the
largest batch whose slowest step (the p99 of :data:`STEPS`) is within
``--auto-step-budget-ms``: the 80 ms of a frame less the host's share of it (hand-over,
intake, delivery). The search stops at ``--auto-max-batch`` and after
``--auto-seconds``, serving the largest batch that passed by then.

The measuring runs in a child process of its own: it loads the model there and gives the
device's memory back whole when it exits, so the pod's own engine finds it free. A paced
engine (``--paced-engine``) is sized from its file's measured step times, with no child.

A device where even one slot misses the budget is no pod: :class:`TooSlow` says the
measured step and the budget, and the pod exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from asrpool.common import protocol

if TYPE_CHECKING:
    import torch

    from asrpool.server import enginechild, models, stepping

FRAME_MS = 1000 * protocol.FRAME_SIZE / protocol.SAMPLE_RATE
RESOLUTION = 1 / 16  # the search stops when the gap is this part of the batch that passed
STEPS = 20
WARMUP = 3
RETRIES = 2


class TooSlow(RuntimeError):
    """Even one slot's step misses the budget: this device cannot serve the model."""


class DoesNotFit(RuntimeError):
    """A pinned batch's streaming state is more than the device's free memory."""


@dataclasses.dataclass(frozen=True)
class Sizing:
    """What ``auto`` chose, and how."""

    slots: int
    step_p99_ms: float  # at ``slots``
    budget_ms: float
    seconds: float  # the whole measurement, the model's load included
    bound: str  # why not more: latency | memory | max_batch | time | profile
    trials: tuple[tuple[int, float | None], ...]  # (batch, p99 step ms; None: did not fit)

    def describe(self) -> str:
        return (f"{self.slots} slots measured (p99 step {self.step_p99_ms:.1f} ms of a "
                f"{self.budget_ms:g} ms budget; {len(self.trials)} trials in "
                f"{self.seconds:.1f} s, bound by {self.bound})")


def next_batch(largest_pass: int, smallest_fail: int | None, max_batch: int,
               resolution: float) -> int | None:
    """The next batch to try, or None when the capacity is known closely enough."""
    if smallest_fail is None:
        return None if largest_pass >= max_batch else min(2 * largest_pass, max_batch)
    if smallest_fail - largest_pass <= max(1, int(largest_pass * resolution)):
        return None
    return (largest_pass + smallest_fail) // 2


def search(trial: Callable[[int], float | None], budget_ms: float, max_batch: int,
           deadline: float, started: float | None = None) -> Sizing:
    """The largest batch whose ``trial`` (its p99 step in ms, None if it did not fit)
    is within ``budget_ms``: doubling from 1, then bisection, until ``deadline``
    (``time.monotonic()``); :class:`TooSlow` if not even one slot passes."""
    started = time.monotonic() if started is None else started
    largest_pass, smallest_fail, failed_by = 0, None, "latency"
    trials: list[tuple[int, float | None]] = []
    batch: int | None = 1
    bound = "max_batch"
    while batch is not None:
        if largest_pass and time.monotonic() > deadline:
            bound = "time"
            break
        p99 = trial(batch)
        trials.append((batch, p99))
        if p99 is not None and p99 <= budget_ms:
            largest_pass = batch
        else:
            smallest_fail, failed_by = batch, "latency" if p99 is not None else "memory"
            bound = failed_by
        if not largest_pass:
            raise _too_slow(p99, budget_ms)
        batch = next_batch(largest_pass, smallest_fail, max_batch, RESOLUTION)
    at = dict(trials)[largest_pass]
    assert at is not None
    return Sizing(largest_pass, at, budget_ms, time.monotonic() - started, bound,
                  tuple(trials))


def _too_slow(p99: float | None, budget_ms: float) -> TooSlow:
    if p99 is None:
        return TooSlow("--batch-size auto: an engine of one slot does not fit in the "
                       "device's memory")
    return TooSlow(f"--batch-size auto: one slot's step takes {p99:.1f} ms (p99 of {STEPS} "
                   f"steps), over the {budget_ms:g} ms budget of an {FRAME_MS:g} ms frame: "
                   "this device cannot serve the model in real time")


def measure(spec: enginechild.EngineSpec, budget_ms: float, max_batch: int,
            seconds: float) -> Sizing:
    """Size the engine ``spec`` names (its batch size is ignored)."""
    if spec.paced_engine is not None:
        return _paced(spec.paced_engine, budget_ms, max_batch)
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(1, mp_context=context) as child:
        return child.submit(_measure_here, spec, budget_ms, max_batch, seconds).result()


def _paced(path: str, budget_ms: float, max_batch: int) -> Sizing:
    """A paced engine steps in its file's measured time: the largest batch within the
    budget, read off the measured points."""
    from asrpool.server import pacing

    started = time.monotonic()
    points = pacing.read_profile(path).points
    fits = [batch for batch in range(1, max_batch + 1)
            if pacing.step_ms(points, batch) <= budget_ms]
    if not fits:
        raise _too_slow(pacing.step_ms(points, 1), budget_ms)
    slots = fits[-1]
    bound = "max_batch" if slots == max_batch else "profile"
    return Sizing(slots, pacing.step_ms(points, slots), budget_ms, time.monotonic() - started,
                  bound, tuple((batch, ms) for batch, ms in points))


def _measure_here(spec: enginechild.EngineSpec, budget_ms: float, max_batch: int,
                  seconds: float) -> Sizing:
    """In the measuring child: the model loaded once, an engine per trial."""
    import torch

    from asrpool.server import engine, enginechild

    started = time.monotonic()
    model = enginechild.load_model(spec)

    def trial(batch: int) -> float | None:
        try:
            with engine.BatchedEngine(model, batch) as probe:
                return fastest_p99_ms(probe, budget_ms)
        except torch.OutOfMemoryError:
            return None
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    return search(trial, budget_ms, max_batch, started + seconds, started)


def fastest_p99_ms(probe: stepping.Engine, budget_ms: float) -> float:
    """The p99 step of the fastest run: a run whose median is within the budget but
    whose slowest step is not is run again, up to :data:`RETRIES` times."""
    best = math.inf
    for _ in range(1 + RETRIES):
        median, p99 = step_times_ms(probe)
        best = min(best, p99)
        if best <= budget_ms or median > budget_ms:
            break
    return best


def step_times_ms(probe: stepping.Engine) -> tuple[float, float]:
    """The median and the slowest of :data:`STEPS` steps with every row busy (after
    :data:`WARMUP`)."""
    rng = np.random.default_rng(0)
    frame = (0.05 * rng.standard_normal(protocol.FRAME_SIZE)).astype(np.float32)
    frames = dict.fromkeys(range(probe.batch_size), frame)
    probe.reset_slots(range(probe.batch_size))
    for _ in range(WARMUP):
        probe.step(frames, checked=True)
    times = []
    for _ in range(STEPS):
        started = time.perf_counter()
        probe.step(frames, checked=True)
        times.append((time.perf_counter() - started) * 1e3)
    times.sort()
    return times[len(times) // 2], times[min(len(times) - 1, math.ceil(0.99 * len(times)) - 1)]


def check_fits(model: models.LoadedModel, batch_size: int,
               available: int | None = None) -> None:
    """Refuse a batch whose streaming state alone is more than the device's free memory
    (``available`` bytes; by default what the device says), with both figures, before
    any of it is allocated."""
    per_slot = state_bytes_per_slot(model)
    have = memory_available(model.device) if available is None else available
    need = per_slot * batch_size
    if need <= have:
        return
    where = "the GPU" if model.device.type == "cuda" else "the machine"
    raise DoesNotFit(
        f"--batch-size {batch_size} needs {_size(need)} of streaming state ({_size(per_slot)} "
        f"a slot), over the {_size(have)} {where} has free: at most {have // per_slot} slots "
        "fit (--batch-size auto measures how many also keep real time)")


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def state_bytes_per_slot(model: models.LoadedModel) -> int:
    """The streaming state of one slot, measured on a batch-1 engine."""
    from asrpool.server import engine

    with engine.BatchedEngine(model, 1) as probe:
        return probe.state_nbytes()


def memory_available(device: torch.device) -> int:
    """Bytes free on a GPU, or the machine's available memory (``MemAvailable``)."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with contextlib.suppress(OSError, StopIteration, ValueError):
        lines = Path("/proc/meminfo").read_text().splitlines()
        line = next(text for text in lines if text.startswith("MemAvailable:"))
        return int(line.split()[1]) * 1024
    return 2**62  # unknown: let the allocator be the judge
