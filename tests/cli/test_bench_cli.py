"""``asrpool bench TARGET``: registered by the bench package itself (no other part loads
it by name), each target importing its benchmark only when it runs; the developers'
benchmarks listed where the harness is installed, and named with how to get it where
it is not."""

from __future__ import annotations

import argparse
import inspect
import subprocess
import sys

import pytest

import asrpool_harness.bench
from asrpool import cli
from asrpool.bench import cli as bench_cli


def test_every_target_is_a_benchmarks_main() -> None:
    for target in bench_cli.BENCHMARKS:
        main = bench_cli.main_of(target)
        assert main.__module__ == f"asrpool.bench.{target}"
        assert list(inspect.signature(main).parameters) == ["argv"], target
    for target in asrpool_harness.bench.BENCHMARKS:
        main = bench_cli.main_of(target)
        assert main.__module__ == f"asrpool_harness.bench.{target}"
        assert list(inspect.signature(main).parameters) == ["argv"], target


def test_without_the_harness_its_benchmarks_say_how_to_get_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_cli, "HARNESS", "asrpool_no_such_harness")
    parser = argparse.ArgumentParser()
    bench_cli.register(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "soak"])
    with pytest.raises(SystemExit, match=r"--baseline nginx comes with the developers' "
                       r"harness: pip install -e harness/"):
        bench_cli.harness_module("nginx", "--baseline nginx")
    assert parser.parse_args(["bench", "capacity"]).target == "capacity"


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
    assert all(target in done.stderr for target in asrpool_harness.bench.BENCHMARKS)
