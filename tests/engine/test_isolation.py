"""Isolation: a stream's output does not depend on what the other slots do.

Sixteen slots see random joins, pauses, resets, leaves and re-joins for longer than
twice the rolling caches' context; every session must get bit-for-bit the tokens,
words, times and extra-head probabilities it gets alone in the same engine. The check
itself lives in ``asrpool_harness.bench.isolation`` so that ``bench/gpu-check`` runs the same
one on CUDA.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from asrpool.server import engine, models
from asrpool_harness.bench import isolation

BATCH = 16
STEPS = 120


@pytest.fixture(scope="module")
def batched_run(
    tiny: models.LoadedModel,
) -> Iterator[tuple[engine.BatchedEngine, list[isolation.Session]]]:
    with engine.BatchedEngine(tiny, BATCH) as eng:
        yield eng, isolation.run_batched(eng, isolation.schedule(7, BATCH, STEPS))


def test_schedule_exercises_joins_pauses_resets_and_long_streams(
    batched_run: tuple[engine.BatchedEngine, list[isolation.Session]], tiny: models.LoadedModel
) -> None:
    _, sessions = batched_run
    longest = max(len(s.frames) for s in sessions)
    assert longest > 2 * tiny.lm.context
    assert len(sessions) > BATCH  # re-joins and resets made new sessions
    assert sum(1 for s in sessions if 0 < len(s.frames) < 20) > 3


def test_streams_are_not_trivial(
    batched_run: tuple[engine.BatchedEngine, list[isolation.Session]], tiny: models.LoadedModel
) -> None:
    _, sessions = batched_run
    assert isolation.triviality(sessions, tiny.lm.context) == []
    long_ones = [s for s in sessions if len(s.frames) >= 20]
    assert len({tuple(s.tokens[:20]) for s in long_ones}) == len(long_ones)


def test_triviality_is_caught() -> None:
    """The guard itself can fail: identical streams and short runs are reported."""
    same = [isolation.Session(slot, 0, frames=[np.zeros(1920)] * 30, tokens=[3] * 30,
                              codes=[[1, 2]] * 30) for slot in range(2)]
    problems = isolation.triviality(same, context=25)
    assert any("differ across streams" in p for p in problems)
    assert any("twice the context" in p for p in problems)
    assert any("no session produced" in p for p in problems)
    assert any("text tokens hardly vary over time in 2 of 2" in p for p in problems)


def _varied(seed: int, tokens: list[int]) -> isolation.Session:
    return isolation.Session(seed, seed, frames=[np.zeros(1920)] * 60, tokens=tokens,
                             codes=[[seed, step] for step in range(60)], events=["Word"])


def test_one_stream_stuck_on_a_token_is_no_triviality_but_most_are() -> None:
    """A random text head may settle on one token for one short stream (seen on CUDA);
    the comparison still means something unless most streams do."""
    lively = [_varied(seed, list(range(60))) for seed in range(3)]
    stuck = [_varied(seed, [5] * 60) for seed in range(3, 6)]
    assert isolation.triviality([*lively, stuck[0]], context=25) == []
    assert isolation.triviality([*lively[:2], *stuck[:2]], context=25) == [
        "text tokens hardly vary over time in 2 of 4 sessions of 20 steps or more"]


def test_every_session_equals_itself_alone(
    batched_run: tuple[engine.BatchedEngine, list[isolation.Session]]
) -> None:
    eng, sessions = batched_run
    assert isolation.differences(eng, sessions) == []
    assert any(s.events for s in sessions)


def test_garbage_in_masked_rows_changes_nothing(
    batched_run: tuple[engine.BatchedEngine, list[isolation.Session]]
) -> None:
    _, clean = batched_run
    with engine.BatchedEngine(models.load_model("tiny"), BATCH) as eng:
        noisy = isolation.run_batched(eng, isolation.schedule(7, BATCH, STEPS),
                                      garbage=np.random.default_rng(3))
    assert [s.tokens for s in noisy] == [s.tokens for s in clean]
    assert [s.events for s in noisy] == [s.events for s in clean]


def test_check_reports_a_clean_run_on_the_cpu() -> None:
    """The whole check as bench/gpu-check runs it (there on CUDA), smaller."""
    report = isolation.check(lambda: models.load_model("tiny", context=10), batch=4, steps=40)
    assert report.ok, report.failures
    assert report.device == "cpu" and report.sessions > 4 and report.frames > 40
