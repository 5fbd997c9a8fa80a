"""The ``asrpool serve`` subcommand (the server pod).

Every field of ``ServerSettings`` is a flag with an ``ASRPOOL_*`` environment variable
(asrpool.common.settings_cli); a flag given on the command line wins. Heavy imports
(torch, fastapi, uvicorn, and the settings class itself) happen only when the command
runs or prints its help.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from asrpool.common import logs, settings_cli

if TYPE_CHECKING:
    from asrpool.server import pods, settings


def settings_class() -> type[settings.ServerSettings]:
    from asrpool.server import settings

    return settings.ServerSettings


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = settings_cli.add_command(
        subparsers, "serve", settings=settings_class,
        help="run a server pod (batched engine + websocket)",
        description="Run a server pod: a batched streaming engine behind a Kyutai-compatible "
                    "websocket. Every flag can also be set as ASRPOOL_<NAME> (flags win).")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from asrpool.common import auth, redis_clients
    from asrpool.server import pacing

    return settings_cli.run("serve", lambda: _prepare(args), _serve,
                            auth.KeyFileError, redis_clients.RedisPasswordError,
                            pacing.ProfileError)


def _prepare(args: argparse.Namespace) -> tuple[settings.ServerSettings, pods.Deps]:
    from asrpool.server import app as app_mod

    config = settings_from(args)
    return config, app_mod.build_deps(config)


def _serve(prepared: tuple[settings.ServerSettings, pods.Deps]) -> int:
    import uvicorn

    from asrpool.common import auth, limits
    from asrpool.server import app as app_mod
    from asrpool.server import draining

    config, deps = prepared
    logs.configure(config.log_level)
    switch_gil(config.gil_switch_ms)
    if config.batch_size == "auto":
        try:
            config, deps = sized(config, deps)
        except Exception as exc:  # too slow, no model, no memory: the pod never serves
            print(f"asrpool serve: {exc}", file=sys.stderr)
            return exit_code(exc)
    app = app_mod.create_app(config, deps)
    uv_config = uvicorn.Config(
        app, host=config.host, port=config.port,
        log_level=config.log_level, ws_max_size=config.max_message_bytes,
        **limits.uvicorn_options(config.connection_limits, app.state.pod.gate),
        # A client that answers no ping within the timeout and sent nothing else
        # meanwhile is gone (moshi-server: 20 s without any frame); one held back by
        # backpressure is not (framing.WebSocketProtocol).
        ws_ping_interval=config.ping_interval_seconds,
        ws_ping_timeout=config.ping_timeout_seconds,
        timeout_graceful_shutdown=5,
        lifespan="on")
    auth.redact_server_logs()
    server = draining.DrainingServer(uv_config, app.state.pod)
    server.run()
    failure = app.state.pod.failure
    if failure is not None:
        print(f"asrpool serve: {failure}", file=sys.stderr)  # the last line: the pool shows it
        return exit_code(failure)
    return 0


def sized(config: settings.ServerSettings, deps: pods.Deps
          ) -> tuple[settings.ServerSettings, pods.Deps]:
    """``--batch-size auto``: the engine measured (``sizing``), the settings and the
    engine's factory at the batch it chose."""
    import dataclasses
    import logging

    from asrpool.server import app as app_mod
    from asrpool.server import enginechild, sizing

    logger = logging.getLogger("asrpool.server.sizing")
    logger.info("--batch-size auto: measuring the engine (at most %g s, batches up to %d, "
                "p99 step within %g ms)", config.auto_seconds, config.auto_max_batch,
                config.auto_step_budget_ms)
    spec = enginechild.EngineSpec.of(config.model_copy(update={"batch_size": 1}))
    chosen = sizing.measure(spec, config.auto_step_budget_ms, config.auto_max_batch,
                            config.auto_seconds)
    logger.info("--batch-size auto: %s", chosen.describe())
    config = config.model_copy(update={"batch_size": chosen.slots})
    return config, dataclasses.replace(deps, engine_factory=app_mod.engine_factory(config),
                                       sizing=chosen)


def switch_gil(interval_ms: float) -> None:
    """The engine thread (or, with ``--engine-process``, the thread handing it batches)
    takes the GIL back from a busy event loop within this, not Python's 5 ms."""
    sys.setswitchinterval(interval_ms / 1e3)


def exit_code(failure: BaseException) -> int:
    """3 for a model that cannot be had (the operator reads it as ``ModelUnavailable``)."""
    from asrpool.common import weights
    from asrpool.server import models

    return weights.EXIT_MODEL_UNAVAILABLE if isinstance(failure, models.ModelError) else 1


def settings_from(args: argparse.Namespace) -> settings.ServerSettings:
    """ServerSettings from the environment, with the flags given on top."""
    return settings_cli.settings_from(args, settings_class())


def main(argv: list[str] | None = None) -> int:
    """``python -m asrpool.server.serve_cli`` (the same as ``asrpool serve``)."""
    parser = argparse.ArgumentParser(prog="asrpool")
    add_parser(parser.add_subparsers(dest="command", required=True,
                                     parser_class=settings_cli.CommandParser))
    args = parser.parse_args(["serve", *(argv or [])] if argv is not None else None)
    handler: Any = args.handler
    return int(handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
