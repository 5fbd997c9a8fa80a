"""Bad input is one line on stderr naming the value or the line, exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asrpool import cli
from asrpool.plan import capacities, scenarios

BASE = ["--peak-streams", "100", "--slots-per-pod", "8", "--pods", "2", "--hours", "1"]


def base_with(flag: str, value: str) -> list[str]:
    """BASE with ``flag`` set to ``value`` (replaced if BASE has it)."""
    if flag not in BASE:
        return [*BASE, flag, value]
    i = BASE.index(flag)
    return [*BASE[:i], flag, value, *BASE[i + 2:]]


def fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    try:
        code = cli.main(["plan", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("asrpool plan: "), err
    return lines[0]


@pytest.mark.parametrize(("flag", "value"), [
    ("--slots-per-pod", "0"), ("--slots-per-pod", "-4"), ("--pods", "0"),
    ("--peak-streams", "-1"), ("--rate", "0"), ("--mean-duration", "0"),
    ("--mean-duration", "-30"), ("--hours", "nan"), ("--queue-timeout-seconds", "-1"),
    ("--startup-seconds", "-5"), ("--gpus-per-pod", "0"), ("--duration-sigma", "x"),
    ("--drain-grace-seconds", "-1"), ("--min-slots", "-8"), ("--trough", "2"),
])
def test_a_value_out_of_range_names_its_flag(
        capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    line = fails(capsys, *base_with(flag, value))
    assert flag in line and value in line


def test_rate_with_a_trace_or_neither(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--peak-streams" in fails(capsys, "--slots-per-pod", "8", "--pods", "1")


def test_a_pool_the_operator_would_refuse(capsys: pytest.CaptureFixture[str]) -> None:
    line = fails(capsys, *BASE, "--autoscale", "--min-slots", "64", "--max-slots", "8")
    assert "minSlots (64) is above maxSlots (8)" in line


def test_a_fixed_pool_needs_its_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--pods" in fails(capsys, "--peak-streams", "10", "--slots-per-pod", "8")


def _trace(tmp_path: Path, text: str) -> str:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("text", "expected"), [
    ("start_s,duration_s\n0,5\n3,5\n2,5\n", "trace.csv line 4: start_s 2 is before the "
                                           "previous line's 3"),
    ("start_s,duration_s\n0,5\n1,abc\n", "trace.csv line 3: duration_s 'abc' is not a number"),
    ("start_s,duration_s\n0,5\n1,-2\n", "trace.csv line 3: duration_s -2 must be positive"),
    ("start_s,duration_s\n0,5\n1,0\n", "trace.csv line 3: duration_s 0 must be positive"),
    ("start_s,duration_s\n-1,5\n", "trace.csv line 2: start_s -1 is negative"),
    ("start_s,duration_s\n0,5\n4\n", "trace.csv line 3: duration_s '' is not a number"),
    ("start_s,duration_s\n0,inf\n", "trace.csv line 2: duration_s 'inf' is not a finite"),
    ("begin,length\n0,5\n", "trace.csv line 1: the header must name the columns"),
    ("start_s,duration_s\n", "trace.csv: the trace has no sessions"),
])
def test_a_bad_trace_names_its_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                    text: str, expected: str) -> None:
    trace = _trace(tmp_path, text)
    assert expected in fails(capsys, "--trace", trace, "--slots-per-pod", "2", "--pods", "1")


def test_a_missing_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    line = fails(capsys, "--trace", str(tmp_path / "none.csv"), "--slots-per-pod", "2",
                 "--pods", "1")
    assert "cannot read the trace" in line and "none.csv" in line


@pytest.mark.parametrize(("body", "expected"), [
    ({"streams_per_gpu": 0, "model": "m"}, "m kept no stream in real time on its device"),
    ({"streams_per_gpu": -1, "model": "m"}, "streams_per_gpu must be an integer of at least 1"),
    ({"streams_per_gpu": "64", "model": "m"}, "streams_per_gpu must be an integer"),
    ({"streams_per_gpu": 64}, "model must be a non-empty string"),
    ([64], "expected a JSON object"),
])
def test_a_bad_capacity_file_names_its_field(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path, body: object,
                                             expected: str) -> None:
    path = tmp_path / "capacity-x.json"
    path.write_text(json.dumps(body))
    line = fails(capsys, "--peak-streams", "10", "--pods", "1", "--capacity-from", str(path))
    assert expected in line


def test_capacity_from_a_bench_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "capacity-stt.json"
    path.write_text(json.dumps({"streams_per_gpu": 48, "model": "kyutai/stt-1b-en_fr"}))
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--peak-streams", "200", "--pods", "5", "--hours", "1",
                     "--capacity-from", str(path), "--json", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["settings"]["slots_per_pod"] == 48


def test_the_newest_result_of_the_model_asked_for_is_found_past_others_that_found_none(
        tmp_path: Path) -> None:
    """A CPU run that found no real-time stream (0) is another model's business."""
    older = tmp_path / "capacity-stt-1b-cuda.json"
    older.write_text(json.dumps({"streams_per_gpu": 768, "model": "stt-1b-en_fr"}))
    newer = tmp_path / "capacity-small-cpu.json"
    newer.write_text(json.dumps({"streams_per_gpu": 0, "model": "small"}))
    os.utime(older, (1, 1))
    found = capacities.newest("stt-1b-en_fr", tmp_path)
    assert found is not None and found.streams_per_gpu == 768
    with pytest.raises(scenarios.PlanError, match="small kept no stream in real time"):
        capacities.newest(None, tmp_path)  # the newest of all is read, and refused
    assert capacities.newest("stt-2.6b-en", tmp_path) is None


def test_help_and_errors_need_no_torch() -> None:
    probe = ("import sys; from asrpool import cli\n"
             "try: cli.main(['plan', '--help'])\n"
             "except SystemExit: pass\n"
             "assert 'torch' not in sys.modules and 'numpy' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "--peak-streams" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "asrpool.cli", "plan", "--slots-per-pod", "0"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == "asrpool plan: argument --slots-per-pod: must be above zero, " \
                                 "got 0"


def test_the_measured_capacities_are_found_from_any_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """They ship with asrpool.bench (its results/ folder), not the checkout's cwd."""
    monkeypatch.chdir(tmp_path)
    found = capacities.newest("stt-1b-en_fr")
    assert found is not None and found.streams_per_gpu > 0
    assert Path(found.source).parent == capacities.RESULTS and capacities.RESULTS.is_dir()
