"""``asrpool bench padding``: moshi-server's zero padding of a stream's first frame,
emulated in one row of the engine beside asrpool's own replicate padding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asrpool_harness.bench import padding


def test_only_the_first_steps_codes_can_differ(tmp_path: Path) -> None:
    """The downsampling convolution comes after Mimi's encoder transformer: from the
    second frame on both rows hold the same samples in its buffer, so no later code may
    differ; and the emulation must change the first step somewhere, or the benchmark
    would measure nothing (a moshi that renamed the padding flag)."""
    assert padding.main(["--model", "tiny", "--streams", "2", "--seconds", "1",
                         "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "padding-tiny-cpu.json").read_text())
    assert result["steps_per_stream"] == 12 and result["codebooks"] == 8
    assert result["streams_with_code_differences"] >= 1
    assert result["max_last_differing_code_step"] <= 0
    assert all(d["codes"] == d["first_step_codes"] for d in result["per_stream"])


def test_a_bad_size_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert padding.main(["--streams", "0"]) == 2
    assert "--streams" in capsys.readouterr().err
