"""The ``bench`` subcommand: ``asrpool bench TARGET [options]`` runs one benchmark, which
writes its JSON results (each benchmark's own ``--help`` lists its options)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

Main = Callable[[list[str]], int]
# The modules of this package that are benchmarks, each imported only when it runs
# (engine, capacity and isolation load torch).
BENCHMARKS = ("engine", "server", "router", "capacity", "isolation", "queue", "soak",
              "padding", "hostwork", "parity", "sockets", "gil", "nocuts", "failover")


def main_of(target: str) -> Main:
    main: Main = importlib.import_module(f"{__package__}.{target}").main
    return main


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark and write JSON results")
    parser.add_argument("target", choices=list(BENCHMARKS))
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="options of that benchmark")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    return int(main_of(args.target)(args.rest))
