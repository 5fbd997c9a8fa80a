"""Running the router app under uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from asrpool.common import auth, framing
from asrpool.router import app, settings, wiring


def uvicorn_config(config: settings.RouterSettings) -> uvicorn.Config:
    # The sans-I/O websockets protocol pauses reading until the app has taken each
    # message and awaits the socket's drain on sends: backpressure in both directions.
    # Frames over max_message_bytes are refused from their header, before they are
    # buffered, with Error{code:"too_large"} and a 1009 close (framing.WebSocketProtocol).
    # Dependencies are built here, not in the lifespan, so that a bad key file fails the
    # command (exit 2) before uvicorn starts; they connect lazily inside its loop.
    uv_config = uvicorn.Config(
        app.create_app(config, wiring.build(config)),
        host=config.host,
        port=config.port,
        ws=framing.WebSocketProtocol,
        ws_max_size=config.max_message_bytes,
        ws_per_message_deflate=False,
        # A client that answers no ping within the timeout and sent nothing else
        # meanwhile is gone; one held back by its pod (not read meanwhile) is not.
        ws_ping_interval=config.ping_interval_s,
        ws_ping_timeout=config.ping_timeout_s,
        lifespan="on",
        log_level=config.log_level,
        timeout_graceful_shutdown=5,
    )
    auth.redact_server_logs()  # after the Config: it configures uvicorn's loggers
    return uv_config


def serve(config: settings.RouterSettings) -> int:
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    server = uvicorn.Server(uvicorn_config(config))
    server.run()
    return 0 if server.started else 1
