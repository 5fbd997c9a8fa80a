"""Isolation: a stream's output does not depend on what the other slots do.

Sixteen slots see random joins, pauses, resets, leaves and re-joins for longer than
twice the rolling caches' context; every session must get bit-for-bit the tokens,
words, times and extra-head probabilities it gets alone in the same engine.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

import numpy as np
import pytest

from asrpool.server import engine, models
from tests.support import streams

BATCH = 16
STEPS = 120


@dataclasses.dataclass
class Session:
    slot: int
    audio_seed: int
    frames: list[np.ndarray] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)
    codes: list[list[int]] = dataclasses.field(default_factory=list)
    events: list[object] = dataclasses.field(default_factory=list)


def _schedule(seed: int) -> list[list[tuple[str, int]]]:
    """Per step, the actions: ('join'|'reset'|'leave'|'frame', slot)."""
    rng = random.Random(seed)
    active = [False] * BATCH
    plan = []
    for step in range(STEPS):
        actions = []
        for slot in range(BATCH):
            steady = slot == 0  # one session spans the whole run (> 2x context)
            if not active[slot]:
                if (steady and step == 0) or (not steady and rng.random() < 0.2):
                    actions.append(("join", slot))
                    active[slot] = True
                continue
            roll = rng.random()
            if not steady and roll < 0.03:
                actions.append(("leave", slot))
                active[slot] = False
                continue
            if not steady and roll < 0.06:
                actions.append(("reset", slot))
            if rng.random() > 0.15:  # otherwise: a pause, no frame this step
                actions.append(("frame", slot))
        plan.append(actions)
    return plan


def _run_batched(eng: engine.BatchedEngine, plan: list[list[tuple[str, int]]],
                 garbage: np.random.Generator | None = None) -> list[Session]:
    sessions: list[Session] = []
    current: dict[int, Session] = {}
    audio: dict[int, np.ndarray] = {}
    for actions in plan:
        frames = {}
        for action, slot in actions:
            if action in ("join", "reset"):
                eng.reset_slot(slot)
                current[slot] = Session(slot, audio_seed=len(sessions))
                sessions.append(current[slot])
                audio[slot] = streams.random_speechlike(12.0, seed=current[slot].audio_seed)
            elif action == "leave":
                del current[slot]
            else:
                session = current[slot]
                i = len(session.frames)
                session.frames.append(audio[slot][i * 1920:(i + 1) * 1920])
                frames[slot] = session.frames[-1]
        masked = None if garbage is None else 100 * garbage.standard_normal((BATCH, 1920))
        result = eng.step(frames, masked_audio=masked)
        for slot in frames:
            _record(current[slot], result, slot)
    return sessions


def _record(session: Session, result: engine.StepResult, slot: int) -> None:
    session.tokens.append(result.text_tokens[slot])
    session.codes.append(result.audio_codes[slot])
    session.events += result.events[slot]


def _run_alone(eng: engine.BatchedEngine, session: Session) -> Session:
    alone = Session(session.slot, session.audio_seed)
    eng.reset_slot(session.slot)
    for frame in session.frames:
        _record(alone, eng.step({session.slot: frame}), session.slot)
    return alone


@pytest.fixture(scope="module")
def batched_run(
    tiny: models.LoadedModel,
) -> Iterator[tuple[engine.BatchedEngine, list[Session]]]:
    with engine.BatchedEngine(tiny, BATCH) as eng:
        yield eng, _run_batched(eng, _schedule(seed=7))


def test_schedule_exercises_joins_pauses_resets_and_long_streams(
    batched_run: tuple[engine.BatchedEngine, list[Session]], tiny: models.LoadedModel
) -> None:
    _, sessions = batched_run
    longest = max(len(s.frames) for s in sessions)
    assert longest > 2 * tiny.lm.context
    assert len(sessions) > BATCH  # re-joins and resets made new sessions
    assert sum(1 for s in sessions if 0 < len(s.frames) < 20) > 3


def test_streams_are_not_trivial(batched_run: tuple[engine.BatchedEngine, list[Session]]) -> None:
    _, sessions = batched_run
    long_ones = [s for s in sessions if len(s.frames) >= 20]
    first_codes = {tuple(s.codes[10]) for s in long_ones}
    assert len(first_codes) == len(long_ones), "codes must differ across streams"
    for s in long_ones:
        assert len({tuple(c) for c in s.codes}) > len(s.codes) // 2, "codes must vary over time"
        assert len(set(s.tokens)) > 3, "text tokens must vary over time"
    assert len({tuple(s.tokens[:20]) for s in long_ones}) == len(long_ones)


def test_every_session_equals_itself_alone(
    batched_run: tuple[engine.BatchedEngine, list[Session]]
) -> None:
    eng, sessions = batched_run
    for session in sessions:
        alone = _run_alone(eng, session)
        assert alone.codes == session.codes, f"codes of session {session.audio_seed}"
        assert alone.tokens == session.tokens, f"tokens of session {session.audio_seed}"
        assert alone.events == session.events, f"events of session {session.audio_seed}"
    assert any(s.events for s in sessions)


def test_garbage_in_masked_rows_changes_nothing(
    batched_run: tuple[engine.BatchedEngine, list[Session]]
) -> None:
    _, clean = batched_run
    with engine.BatchedEngine(models.load_model("tiny"), BATCH) as eng:
        noisy = _run_batched(eng, _schedule(seed=7), garbage=np.random.default_rng(3))
    assert [s.tokens for s in noisy] == [s.tokens for s in clean]
    assert [s.events for s in noisy] == [s.events for s in clean]
