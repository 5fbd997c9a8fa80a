"""``asrpool bench TARGET``: registered by the bench package itself (no other part loads
it by name), each target importing its benchmark only when it runs."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from asrpool import cli
from asrpool.bench import cli as bench_cli


def test_every_target_is_a_benchmarks_main() -> None:
    for target in bench_cli.BENCHMARKS:
        main = bench_cli.main_of(target)
        assert main.__module__ == f"asrpool.bench.{target}"
        assert list(inspect.signature(main).parameters) == ["argv"], target


def test_the_command_line_runs_the_target_with_the_rest_of_its_options(
        monkeypatch: pytest.MonkeyPatch) -> None:
    told: list[list[str]] = []

    def queue_main(argv: list[str]) -> int:
        told.append(argv)
        return 3

    monkeypatch.setattr(bench_cli, "main_of", lambda target: {"queue": queue_main}[target])
    assert cli.main(["bench", "queue", "--waiters", "2", "--out", "x.json"]) == 3
    assert told == [["--waiters", "2", "--out", "x.json"]]


def test_an_unknown_target_names_the_choices() -> None:
    done = subprocess.run([sys.executable, "-m", "asrpool.cli", "bench", "nginx"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "invalid choice: 'nginx'" in done.stderr
    assert all(target in done.stderr for target in bench_cli.BENCHMARKS)
