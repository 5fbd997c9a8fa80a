"""Bad frames and slots are refused with a clear error and corrupt no other slot."""

from __future__ import annotations

import numpy as np
import pytest

from asrpool.server import engine, models
from tests.support import streams


def _run(eng: engine.BatchedEngine, frames: list[np.ndarray], bad: dict | None = None,
         at: int = -1) -> list[int]:
    eng.reset_slot(0)
    eng.reset_slot(1)
    tokens = []
    for i, frame in enumerate(frames):
        if i == at and bad is not None:
            with pytest.raises(engine.EngineInputError) as info:
                eng.step({0: frame, **bad})
            bad["error"] = str(info.value)
        tokens.append(eng.step({0: frame}).text_tokens[0])
    return tokens


@pytest.mark.parametrize(("name", "bad_frame", "message"), [
    ("short", np.zeros(100, dtype=np.float32), "must be 1920 mono samples, got (100,)"),
    ("stereo", np.zeros((2, 1920), dtype=np.float32), "must be 1920 mono samples"),
    ("nan", np.full(1920, np.nan, dtype=np.float32), "NaN or infinite"),
    ("inf", np.full(1920, np.inf, dtype=np.float32), "NaN or infinite"),
])
def test_bad_frame_is_refused_and_other_slots_carry_on(
    tiny: models.LoadedModel, name: str, bad_frame: np.ndarray, message: str
) -> None:
    frames = streams.frames_of(streams.random_speechlike(2.0, seed=9))
    with engine.BatchedEngine(tiny, 2) as eng:
        clean = _run(eng, frames)
        bad: dict = {1: bad_frame}
        dirty = _run(eng, frames, bad, at=5)
    assert message in bad["error"]
    assert dirty == clean


def test_slot_out_of_range_is_refused(tiny: models.LoadedModel) -> None:
    with (engine.BatchedEngine(tiny, 2) as eng,
          pytest.raises(engine.EngineInputError, match=r"slot 2 is out of range \(0..1\)")):
        eng.reset_slot(2)


def test_one_model_has_one_engine_at_a_time(tiny: models.LoadedModel) -> None:
    with (engine.BatchedEngine(tiny, 1),
          pytest.raises(engine.EngineInputError, match="already owned")):
        engine.BatchedEngine(tiny, 1)
    engine.BatchedEngine(tiny, 1).close()  # free again once closed


def test_batch_size_must_be_positive(tiny: models.LoadedModel) -> None:
    with pytest.raises(engine.EngineInputError, match="at least 1"):
        engine.BatchedEngine(tiny, 0)
