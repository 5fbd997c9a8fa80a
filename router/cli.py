"""``asrpool route``: run one router replica (registered into the ``asrpool`` command).

Every field of ``RouterSettings`` is a flag with an ``ASRPOOL_*`` environment variable
(asrpool.common.settings_cli); flags win. Heavy imports (FastAPI, Redis, uvicorn, the
settings class) happen only when the command runs or prints its help.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from asrpool.common import settings_cli

if TYPE_CHECKING:
    from asrpool.router import settings


def settings_class() -> type[settings.RouterSettings]:
    from asrpool.router import settings

    return settings.RouterSettings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = settings_cli.add_command(
        subparsers, "route", settings=settings_class,
        help="run a router: one websocket endpoint in front of a pool of server pods",
        description="Admit streams atomically in Redis, pin them to pods, proxy them. "
        "Every flag can also be set as an ASRPOOL_* environment variable; flags win.",
    )
    parser.set_defaults(handler=run)


def settings_from(args: argparse.Namespace) -> settings.RouterSettings:
    return settings_cli.settings_from(args, settings_class())


def checked(config: settings.RouterSettings) -> settings.RouterSettings:
    """The settings, once their files are read: a bad key or password file fails here,
    before any fork (``auth.KeyFileError``, ``redis_clients.RedisPasswordError``)."""
    from asrpool.common import auth

    if config.api_keys_file is not None:
        auth.load_keys(config.api_keys_file)
    config.redis_password_value()
    return config


def start(config: settings.RouterSettings) -> int:
    from asrpool.router import sharedmetrics

    with sharedmetrics.folder_for(config.workers):
        from asrpool.router import serving  # imports prometheus_client: after the folder

        return serving.serve(config)


def run(args: argparse.Namespace) -> int:
    from asrpool.common import auth, redis_clients

    return settings_cli.run("route", lambda: checked(settings_from(args)), start,
                            auth.KeyFileError, redis_clients.RedisPasswordError)
