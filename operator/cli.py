"""Subcommands of the operator (registered into the ``asrpool`` command).

Every field of ``OperatorSettings`` is a flag with an ``ASRPOOL_*`` environment variable
(asrpool.common.settings_cli); flags win. Four are the command's own (``OWN``): the
scope (``-n/--namespace`` repeatable, ``-A/--all-namespaces``, one or the other),
``--liveness URL`` and ``--network-policy-from JSON``.

Registering imports nothing heavy: kopf, kubernetes and pydantic load only when the
subcommand runs or prints its help.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from asrpool.common import settings_cli

if TYPE_CHECKING:
    from asrpool.operator import settings

# The fields whose flags the command adds itself, and those flags (as errors name them).
OWN_FLAGS = {"namespaces": "-n/--namespace", "all_namespaces": "-A/--all-namespaces",
             "liveness_endpoint": "--liveness", "network_policy_from": "--network-policy-from"}
OWN = tuple(OWN_FLAGS)


def settings_class() -> type[settings.OperatorSettings]:
    from asrpool.operator import settings

    return settings.OperatorSettings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = settings_cli.add_command(
        subparsers, "operator", settings=settings_class, own=OWN, extras=_add_own_flags,
        help="run the Kubernetes operator for StreamingASRPool resources",
        description="Run the kopf operator that turns StreamingASRPool resources into server"
        " pods. Every flag can also be set as an ASRPOOL_* environment variable; flags win.",
    )
    parser.set_defaults(handler=_run)


def _add_own_flags(parser: argparse.ArgumentParser,
                   config_class: type[settings.OperatorSettings]) -> None:
    def text(name: str) -> str:
        return settings_cli.help_text(config_class, name)

    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", dest="namespaces", action="append", metavar="NAME",
                       help=text("namespaces"))
    scope.add_argument("-A", "--all-namespaces", action="store_const", const=True,
                       help=text("all_namespaces"))
    parser.add_argument("--liveness", dest="liveness_endpoint", metavar="URL",
                        help=text("liveness_endpoint"))
    parser.add_argument("--network-policy-from", type=json.loads, metavar="JSON",
                        help=text("network_policy_from"))


def load_settings(args: argparse.Namespace) -> settings.OperatorSettings:
    """Flags over ``ASRPOOL_*`` environment variables over defaults."""
    return settings_cli.settings_from(args, settings_class())


def _checked(args: argparse.Namespace) -> settings.OperatorSettings:
    config = load_settings(args)
    config.redis_password_value()  # an unreadable password file fails here, not later
    return config


def _run(args: argparse.Namespace) -> int:
    from asrpool.common import redis_clients
    from asrpool.operator import running

    return settings_cli.run("operator", lambda: _checked(args), running.run,
                            redis_clients.RedisPasswordError, own_flags=OWN_FLAGS)
