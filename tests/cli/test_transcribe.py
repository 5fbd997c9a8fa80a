"""`asrpool transcribe`: words for a file, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sphn

from asrpool.common import audio
from asrpool.server import engine, models, transcribing

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "hello.wav"


def _asrpool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "asrpool.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_transcribe_prints_the_engines_words_for_the_sample() -> None:
    result = _asrpool("transcribe", str(SAMPLE), "--json", "--batch-size", "2")
    assert result.returncode == 0, result.stderr
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    with engine.BatchedEngine(models.load_model("tiny"), 2) as eng:
        expected = transcribing.words_of(transcribing.run_messages(
            eng, audio.kyutai_file_messages(audio.load_audio(SAMPLE))))
    assert len(printed) == len(expected) > 3
    assert [m.get("text") for m in printed] == [getattr(e, "text", None) for e in expected]
    assert {m["type"] for m in printed} == {"Word", "EndWord"}


def test_any_sample_rate_is_resampled_to_24khz(tmp_path: Path) -> None:
    pcm = audio.load_audio(SAMPLE)
    path = tmp_path / "s44.wav"
    sphn.write_wav(str(path), np.interp(np.arange(0, len(pcm), 24000 / 44100),
                                        np.arange(len(pcm)), pcm).astype(np.float32), 44100)
    again = audio.load_audio(path)
    assert abs(len(again) - len(pcm)) < 2400


@pytest.mark.parametrize(("args", "message"), [
    (["transcribe", "/nonexistent.wav"], "no such audio file: /nonexistent.wav"),
    (["transcribe", str(ROOT / "pyproject.toml")], "cannot decode"),
    (["transcribe", str(SAMPLE), "--model", "nope"], "unknown model 'nope'"),
    (["transcribe", str(SAMPLE), "--dtype", "int8"], "unknown dtype 'int8'"),
])
def test_bad_input_is_one_line_and_nonzero(args: list[str], message: str) -> None:
    result = _asrpool(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
