"""The paced engine (``serve --paced-engine FILE``): its step time from a bench capacity
result, its answers (those of the measured model, markers after the same delay as the
model's engine), and the files it refuses, each in one line naming the file."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asrpool.server import answers, engine, engine_loop, events, models, pacing, slots, stepping
from tests.server import conftest

H200 = Path(__file__).resolve().parents[2] / "bench/results/capacity-stt-1b-en_fr-cuda.json"
POINTS = ((16, 10.0), (32, 20.0), (64, 24.0))


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "capacity.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _file(model: str = "tiny", batch_size: int = 2, ms: float = 1.0) -> dict[str, Any]:
    return {"benchmark": "capacity", "model": model, "device_name": "Test GPU",
            "batches": [{"batch_size": batch_size, "cuda_graphs": None, "oom": False,
                         "engine_p50_ms": ms}]}


# The step time: a pure function of the measured points and the pod's batch size.


@pytest.mark.parametrize(("batch", "ms"), [(16, 10.0), (32, 20.0), (64, 24.0)])
def test_a_measured_batch_takes_its_measured_time(batch: int, ms: float) -> None:
    assert pacing.step_ms(POINTS, batch) == ms


@pytest.mark.parametrize(("batch", "ms"), [(24, 15.0), (48, 22.0), (40, 21.0)])
def test_between_measured_batches_the_time_is_on_the_line(batch: int, ms: float) -> None:
    assert pacing.step_ms(POINTS, batch) == pytest.approx(ms)


def test_beyond_the_largest_batch_the_last_two_extrapolate() -> None:
    assert pacing.step_ms(POINTS, 128) == pytest.approx(24.0 + 4.0 * 64 / 32)


def test_beyond_the_largest_batch_no_step_is_faster_than_the_largest() -> None:
    falling = ((16, 10.0), (32, 8.0))  # noise: a larger batch measured faster
    assert pacing.step_ms(falling, 64) == 8.0


def test_below_the_smallest_batch_its_time_scales_down() -> None:
    assert pacing.step_ms(POINTS, 4) == pytest.approx(2.5)
    assert pacing.step_ms(POINTS, 1) == pytest.approx(10.0 / 16)


def test_one_measured_batch_scales_both_ways() -> None:
    assert pacing.step_ms(((16, 10.0),), 32) == pytest.approx(20.0)
    assert pacing.step_ms(((16, 10.0),), 8) == pytest.approx(5.0)


def test_the_committed_h200_file_paces_with_cuda_graphs_on() -> None:
    """The file holds both searches; a pod runs with graphs on (off: about 50 ms at 16)."""
    profile = pacing.read_profile(H200)
    assert (profile.model, profile.measured_on) == ("stt-1b-en_fr", "NVIDIA H200")
    assert profile.answers == _preset_answers("stt-1b-en_fr")
    assert [batch for batch, _ in profile.points] == [16, 32, 64, 128, 256, 512, 768, 1024]
    assert pacing.step_ms(profile.points, 16) == 12.266
    assert pacing.step_ms(profile.points, 768) == 50.642
    assert pacing.step_ms(profile.points, 640) == pytest.approx((35.184 + 50.642) / 2)


def _preset_answers(name: str) -> answers.Answers:
    """What the preset built with moshi's constructors answers with: its delay and its
    extra heads (which the paced engine must answer as, building nothing)."""
    preset = models.PRESETS[name]
    return answers.Answers(preset.asr_delay_in_tokens, preset.lm_kwargs["extra_heads_num_heads"])


# Its answers.


def _steps(engine_: stepping.Engine,
           batches: Iterator[slots.Batch]) -> list[engine_loop.StepOutput]:
    return [engine_loop.run_batch(engine_, batch) for batch in batches]


def _batches(steps: int = 24) -> Iterator[slots.Batch]:
    """Two streams: markers with frames still queued, a pause of one stream, an ``Init``
    that keeps its markers, and a reset that drops them."""
    audio = {slot: conftest.speechlike(steps * 0.08, seed=slot + 3) for slot in (0, 1)}
    markers = {2: [(0, 10, 3)], 4: [(1, 11, 0)], 12: [(0, 12, 1), (1, 13, 2)]}
    for i in range(steps):
        live = [slot for slot in (0, 1) if not (slot == 1 and 5 <= i < 9)]
        frames = {slot: audio[slot][i * slots.FRAME_SIZE:(i + 1) * slots.FRAME_SIZE]
                  for slot in live}
        yield slots.Batch(generations={}, resets={0: [0, 1], 15: [1]}.get(i, []),
                          restarts=[0] if i == 10 else [], markers=markers.get(i, []),
                          frames=frames, arrivals={}, buffered={})


def _but_words(outputs: list[engine_loop.StepOutput]) -> list[tuple[Any, ...]]:
    """Every event but words, in order: (step, slot, kind, marker id, step_idx, prs)."""
    return [(i, slot, type(event).__name__, getattr(event, "id", None),
             getattr(event, "step_idx", None), len(getattr(event, "prs", ())))
            for i, output in enumerate(outputs) for slot, slot_events in output.events.items()
            for event in slot_events if not isinstance(event, events.Word | events.EndWord)]


def test_markers_come_back_when_the_models_engine_gives_them(tmp_path: Path) -> None:
    paced = pacing.build(_write(tmp_path, _file("tiny")), batch_size=2)
    with engine.BatchedEngine(models.build_random("tiny"), 2) as real:
        expected = _but_words(_steps(real, _batches()))
    got = _but_words(_steps(paced, _batches()))
    assert got == expected
    assert {marker for *_, kind, marker, _, _ in got if kind == "Marker"} == {10, 11, 12}
    assert sum(kind == "Step" for *_, kind, _, _, _ in got) == 44  # one per frame
    assert {prs for *_, kind, _, _, prs in got if kind == "Step"} == {4}


def test_a_stream_hears_a_pseudo_word_now_and_then_with_its_own_times(tmp_path: Path) -> None:
    paced = pacing.build(_write(tmp_path, _file("stt-1b-en_fr")), batch_size=4)
    frame = np.zeros(slots.FRAME_SIZE, dtype=np.float32)
    said = [event for _ in range(31) for event in paced.step({2: frame}).events[2]
            if isinstance(event, events.Word | events.EndWord)]
    assert said == [events.Word("alfa", 0.0), events.EndWord(0.32),
                    events.Word("bravo", 0.32), events.EndWord(1.12),
                    events.Word("charlie", 1.12), events.EndWord(1.92)]


def test_a_model_without_extra_heads_gets_no_steps_and_its_own_delay(tmp_path: Path) -> None:
    paced = pacing.build(_write(tmp_path, _file("kyutai/stt-2.6b-en")), batch_size=1)
    paced.add_marker(0, 5, frames_pending=0)
    frame = np.zeros(slots.FRAME_SIZE, dtype=np.float32)
    said = [paced.step({0: frame}).events[0] for _ in range(33)]
    assert not [event for step in said for event in step if isinstance(event, events.Step)]
    assert [i for i, step in enumerate(said) if events.Marker(5) in step] == [31]  # 32 steps


def test_the_pace_says_what_it_stands_in_for(tmp_path: Path) -> None:
    paced = pacing.build(_write(tmp_path, _file("stt-1b-en_fr", batch_size=8, ms=20.0)), 4)
    assert paced.pace == pacing.Pace("stt-1b-en_fr", "Test GPU", 10.0)
    assert paced.pace.label == "stt-1b-en_fr (Test GPU bench capacity)"
    assert engine_loop.Ready.of(paced).pace == paced.pace


def test_a_paced_engine_imports_no_torch() -> None:
    code = ("import sys, numpy as np; from asrpool.server import app, pacing; "
            f"e = pacing.build({str(H200)!r}, 2); "
            "e.step({0: np.zeros(1920, dtype=np.float32)}); "
            "print('torch' in sys.modules, 'moshi' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.split() == ["False", "False"]


# The files it refuses.


def _row(**fields: Any) -> dict[str, Any]:
    return {"batch_size": 16, "cuda_graphs": True, "oom": False, "engine_p50_ms": 12.0} | fields


BAD_FILES: dict[str, tuple[Any, str]] = {
    "not json": ("{\"model\": ", "is not JSON"),
    "not an object": ([_row()], "holds no bench capacity result"),
    "another benchmark": ({"benchmark": "server", "model": "tiny", "batches": [_row()]},
                          "is a 'server' benchmark, not bench capacity"),
    "no model": ({"batches": [_row()]}, "names no model"),
    "an empty model": ({"model": "", "batches": [_row()]}, "names no model"),
    "an unknown model": ({"model": "someone/fine-tune", "batches": [_row()]},
                         "measured model 'someone/fine-tune', which the paced engine cannot"),
    "no batches": ({"model": "tiny"}, "has no batches"),
    "empty batches": ({"model": "tiny", "batches": []}, "has no batches"),
    "a batch not an object": ({"model": "tiny", "batches": [_row(), 3]},
                              "has a batch that is not a JSON object"),
    "a batch without a time": ({"model": "tiny", "batches": [{"batch_size": 16}]},
                               "has a batch of 16 without a number for engine_p50_ms"),
    "a time as text": ({"model": "tiny", "batches": [_row(engine_p50_ms="12")]},
                       "has a batch of 16 without a number for engine_p50_ms"),
    "a time NaN": ('{"model": "tiny", "batches": [{"batch_size": 16, "engine_p50_ms": NaN}]}',
                   "has a batch of 16 without a number for engine_p50_ms"),
    "a zero time": ({"model": "tiny", "batches": [_row(), _row(batch_size=32,
                                                               engine_p50_ms=0)]},
                    "has a batch of 32 whose engine_p50_ms is 0, not a positive time"),
    "a negative time": ({"model": "tiny", "batches": [_row(engine_p50_ms=-1.5)]},
                        "whose engine_p50_ms is -1.5, not a positive time"),
    "an infinite time": ('{"model": "tiny", "batches": [{"batch_size": 8, '
                         '"engine_p50_ms": Infinity}]}', "not a positive time"),
    "no batch size": ({"model": "tiny", "batches": [{"engine_p50_ms": 12.0}]},
                      "has a batch whose batch_size is None"),
    "a zero batch size": ({"model": "tiny", "batches": [_row(batch_size=0)]},
                          "has a batch whose batch_size is 0, not a whole number"),
    "a fractional batch size": ({"model": "tiny", "batches": [_row(batch_size=2.5)]},
                                "batch_size is 2.5"),
    "nothing fit in memory": ({"model": "tiny", "batches": [
        {"batch_size": 16, "cuda_graphs": True, "oom": True, "note": "CUDA out of memory"}]},
        "has no measured batch (none fit in memory)"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_file_is_refused_in_one_line_naming_it(tmp_path: Path, case: str) -> None:
    data, what = BAD_FILES[case]
    path = _write(tmp_path, data)
    with pytest.raises(pacing.ProfileError) as info:
        pacing.read_profile(path)
    assert str(info.value).startswith(f"paced engine file {path}: ")
    assert what in str(info.value) and "\n" not in str(info.value)


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(pacing.ProfileError, match=f"^paced engine file {tmp_path}/nope.json: "
                                                  "no such file$"):
        pacing.read_profile(tmp_path / "nope.json")


def test_a_batch_that_did_not_fit_is_no_measurement(tmp_path: Path) -> None:
    path = _write(tmp_path, {"model": "tiny", "batches": [
        _row(), {"batch_size": 64, "cuda_graphs": True, "oom": True, "note": "too big"}]})
    assert pacing.read_profile(path).points == ((16, 12.0),)


@pytest.mark.parametrize("data", [None, "{}"], ids=["missing", "malformed"])
def test_serve_refuses_a_bad_file_at_start_in_one_line(tmp_path: Path, data: str | None) -> None:
    path = tmp_path / "capacity.json"
    if data is not None:
        path.write_text(data)
    result = subprocess.run([sys.executable, "-m", "asrpool.cli", "serve", "--paced-engine",
                             str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith(f"asrpool serve: paced engine file {path}: ")
    assert len(result.stderr.strip().splitlines()) == 1  # no traceback
