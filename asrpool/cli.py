"""The ``asrpool`` command: one entry point, one subcommand per job.

Each part registers its own subcommands and imports its heavy modules (torch, kopf)
only when its subcommand runs, so ``asrpool route --help`` never loads a model stack.
"""

from __future__ import annotations

import argparse
import logging
import sys
import typing
from collections.abc import Callable, Sequence

from asrpool.common import settings_cli

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _registrars() -> list[Registrar]:
    from asrpool.bench import cli as bench_cli
    from asrpool.client import cli as client_cli
    from asrpool.operator import cli as operator_cli
    from asrpool.plan import cli as plan_cli
    from asrpool.router import cli as router_cli
    from asrpool.server import cli as server_cli

    return [server_cli.register, router_cli.register, operator_cli.register, client_cli.register,
            plan_cli.register, bench_cli.register]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asrpool", description="Serve streaming speech recognition at scale."
    )
    # A command's settings flags are added when it parses (asrpool.common.settings_cli);
    # registrars see plain argparse parsers (a CommandParser is one).
    subparsers = typing.cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                              parser_class=settings_cli.CommandParser))
    for register in _registrars():
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # torch warns on import that a CUDA build finds no CUDA runtime; on a CPU machine
    # that is expected and only noise on every command's stderr.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
