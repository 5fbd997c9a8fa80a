"""The ``bench`` subcommand: ``asrpool bench TARGET [options]`` runs one benchmark, which
writes its JSON results (each benchmark's own ``--help`` lists its options).

The product carries the measurements a user runs against their own deployment: the
engine's capacity search (``capacity``, which sizes pods) and the load tests of a pod
(``server``) and of a router (``router``). The developers' experiments (soak, parity,
isolation, sockets' and the GIL's costs, ...) live in the repository's harness package
(``harness/``, ``asrpool_harness.bench``); where it is installed, its benchmarks are
listed here too.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from types import ModuleType

Main = Callable[[list[str]], int]
# The modules of this package that are benchmarks, each imported only when it runs
# (capacity loads torch).
BENCHMARKS = ("server", "router", "capacity", "sockets")
HARNESS = "asrpool_harness.bench"
GET_HARNESS = "pip install -e harness/ from a clone of the repository"


def harness() -> ModuleType | None:
    """The developers' benchmarks, where they are installed."""
    try:
        return importlib.import_module(HARNESS)
    except ModuleNotFoundError:
        return None


def harness_module(name: str, what: str) -> ModuleType:
    """A module of the harness that ``what`` needs; SystemExit saying how to get it."""
    if harness() is None:
        raise SystemExit(f"{what} comes with the developers' harness: {GET_HARNESS}")
    return importlib.import_module(f"{HARNESS}.{name}")


def main_of(target: str) -> Main:
    package = __package__ if target in BENCHMARKS else HARNESS
    main: Main = importlib.import_module(f"{package}.{target}").main
    return main


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    extra = harness()
    targets = [*BENCHMARKS, *(extra.BENCHMARKS if extra is not None else ())]
    parser = subparsers.add_parser(
        "bench", help="run a benchmark and write JSON results",
        epilog=None if extra is not None else "The developers' benchmarks (soak, parity, "
        f"isolation, ...) come with the repository's harness: {GET_HARNESS}.")
    parser.add_argument("target", choices=targets)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="options of that benchmark")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    return int(main_of(args.target)(args.rest))
