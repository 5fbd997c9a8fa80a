"""The ``asrpool serve`` subcommand (the server pod).

Every flag has an ``ASRPOOL_*`` environment variable (pydantic-settings); a flag given
on the command line wins. Heavy imports (torch, fastapi, uvicorn) happen only when the
command runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

# flag -> (settings field, type, help). Defaults live in ServerSettings alone.
_FLAGS: dict[str, tuple[str, Any, str]] = {
    "--model": ("model", str, "tiny | small | stt-1b-en_fr | stt-2.6b-en | <dir> | <hf repo>"),
    "--model-revision": ("model_revision", str, "Hugging Face revision of --model"),
    "--batch-size": ("batch_size", int, "stream slots (rows of the batched engine)"),
    "--context": ("context", int, "rolling KV cache length in steps (default: the model's)"),
    "--device": ("device", str, "torch device (cpu, cuda, cuda:1)"),
    "--dtype": ("dtype", str, "auto (bfloat16 on CUDA, float32 elsewhere) | float32 | bfloat16"
                " | float16"),
    "--torch-threads": ("torch_threads", int, "CPU threads for torch (default: torch's)"),
    "--host": ("host", str, "address to listen on (default 0.0.0.0)"),
    "--port": ("port", int, "port to listen on (default 8080)"),
    "--redis-url": ("redis_url", str, "heartbeat into this Redis (slot registry; no password in"
                    " it)"),
    "--redis-password-file": ("redis_password_file", str, "file holding the Redis password"
                              " (or ASRPOOL_REDIS_PASSWORD)"),
    "--pool": ("pool", str, "pool name (default 'default')"),
    "--pod-id": ("pod_id", str, "pod id in the registry (default: the hostname)"),
    "--advertise-address": ("advertise_address", str, "host:port routers dial"),
    "--api-keys-file": ("api_keys_file", str, "hashed API key file; clients then need a key"),
    "--pod-token": ("pod_token", str, "shared secret routers send in asrpool-pod-token"),
    "--drain-grace-seconds": ("drain_grace_seconds", float, "SIGTERM: wait this long"),
    "--max-buffer-seconds": ("max_buffer_seconds", float, "per-slot audio cap (backpressure)"),
    "--resume-grace-seconds": ("resume_grace_seconds", float, "keep a dropped stream this long"),
    "--idle-timeout-seconds": ("idle_timeout_seconds", float,
                               "drop a client sending no audio for this long"),
    "--ping-interval-seconds": ("ping_interval_seconds", float, "websocket ping period"),
    "--ping-timeout-seconds": ("ping_timeout_seconds", float,
                               "drop a client not answering a ping within this"),
    "--max-message-bytes": ("max_message_bytes", int, "largest client message accepted"),
    "--max-upload-bytes": ("max_upload_bytes", int, "largest POST /api/asr-streaming body"),
    "--max-messages-per-second": ("max_messages_per_second", float,
                                  "per connection; audio messages of 1920+ samples are free"),
    "--message-burst": ("message_burst", float, "messages a connection may save up"),
    "--max-pending-markers": ("max_pending_markers", int,
                              "markers per stream waiting for their audio"),
    "--send-timeout-seconds": ("send_timeout_seconds", float,
                               "drop a client whose unread results stall sends this long"),
    "--max-head-bytes": ("max_head_bytes", int, "largest request line + headers (else 431)"),
    "--max-headers": ("max_headers", int, "most request header lines (else 431)"),
    "--max-url-bytes": ("max_url_bytes", int, "longest request target, path + query (else 414)"),
    "--handshake-timeout-seconds": ("handshake_timeout_seconds", float,
                                    "a request head must be complete within this (else 408)"),
    "--max-connections": ("max_connections", int, "connections per process (else 503)"),
    "--new-streams-per-second": ("new_streams_per_second", float,
                                 "new streams per second of the process (else 429; 0: any)"),
    "--new-streams-burst": ("new_streams_burst", float, "new streams the process may save up"),
    "--heartbeat-interval-seconds": ("heartbeat_interval_seconds", float, "Redis beat period"),
    "--log-level": ("log_level", str, "debug | info | warning | error"),
}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve", help="run a server pod (batched engine + websocket)",
        description="Run a server pod: a batched streaming engine behind a Kyutai-compatible "
                    "websocket. Every flag can also be set as ASRPOOL_<NAME> (flags win).")
    for flag, (field, kind, text) in _FLAGS.items():
        env = "ASRPOOL_" + field.upper()
        parser.add_argument(flag, dest=field, type=kind, default=None, help=f"{text} [{env}]")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import pydantic
    import uvicorn

    from asrpool.common import auth, limits, redis_clients
    from asrpool.server import app as app_mod
    from asrpool.server import draining

    try:
        config = settings_from(args)
        deps = app_mod.build_deps(config)
    except (pydantic.ValidationError, auth.KeyFileError, redis_clients.RedisPasswordError) as exc:
        print(f"asrpool serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = app_mod.create_app(config, deps)
    uv_config = uvicorn.Config(
        app, host=config.host, port=config.port,
        log_level=config.log_level, ws_max_size=config.max_message_bytes,
        **limits.uvicorn_options(config.connection_limits, app.state.pod),
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


def exit_code(failure: BaseException) -> int:
    """3 for a model that cannot be had (the operator reads it as ``ModelUnavailable``)."""
    from asrpool.common import weights
    from asrpool.server import models

    return weights.EXIT_MODEL_UNAVAILABLE if isinstance(failure, models.ModelError) else 1


def settings_from(args: argparse.Namespace) -> Any:
    """ServerSettings from the environment, with the flags given on top."""
    from asrpool.server import settings

    flags = {field: getattr(args, field) for field, _, _ in _FLAGS.values()}
    return settings.ServerSettings(**{k: v for k, v in flags.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    """``python -m asrpool.server.serve_cli`` (the same as ``asrpool serve``)."""
    parser = argparse.ArgumentParser(prog="asrpool")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", *(argv or [])] if argv is not None else None)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
