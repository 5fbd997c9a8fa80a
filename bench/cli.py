"""The ``bench`` subcommand: ``asrpool bench TARGET [options]`` runs one benchmark, which
writes its JSON results (each benchmark's own ``--help`` lists its options)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Main = Callable[[list[str]], int]


def _engine() -> Main:
    from asrpool.bench import engine
    return engine.main


def _server() -> Main:
    from asrpool.bench import server
    return server.main


def _router() -> Main:
    from asrpool.bench import router
    return router.main


def _capacity() -> Main:
    from asrpool.bench import capacity
    return capacity.main


def _isolation() -> Main:
    from asrpool.bench import isolation
    return isolation.main


def _queue() -> Main:
    from asrpool.bench import queue
    return queue.main


def _soak() -> Main:
    from asrpool.bench import soak
    return soak.main


# Each benchmark is imported only when it runs: engine, capacity and isolation load torch.
BENCHMARKS: dict[str, Callable[[], Main]] = {
    "engine": _engine, "server": _server, "router": _router, "capacity": _capacity,
    "isolation": _isolation, "queue": _queue, "soak": _soak,
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark and write JSON results")
    parser.add_argument("target", choices=list(BENCHMARKS))
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="options of that benchmark")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    return int(BENCHMARKS[args.target]()(args.rest))
