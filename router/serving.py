"""Running the router app under uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from asrpool.common import framing
from asrpool.router import app, settings, wiring


def uvicorn_config(config: settings.RouterSettings) -> uvicorn.Config:
    # The sans-I/O websockets protocol pauses reading until the app has taken each
    # message and awaits the socket's drain on sends: backpressure in both directions.
    # Frames over max_message_bytes are refused from their header, before they are
    # buffered, with Error{code:"too_large"} and a 1009 close (framing.LimitedFrames).
    # Dependencies are built here, not in the lifespan, so that a bad key file fails the
    # command (exit 2) before uvicorn starts; they connect lazily inside its loop.
    return uvicorn.Config(
        app.create_app(config, wiring.build(config)),
        host=config.host,
        port=config.port,
        ws=framing.LimitedFrames,
        ws_max_size=config.max_message_bytes,
        ws_per_message_deflate=False,
        # A client whose stream is held back by its pod is not read meanwhile, so its
        # pongs wait behind its audio; a pod takes a frame of every stream each step,
        # so that wait is far shorter than the timeout.
        ws_ping_interval=config.ping_interval_s,
        ws_ping_timeout=config.ping_timeout_s,
        lifespan="on",
        log_level=config.log_level,
        timeout_graceful_shutdown=5,
    )


def serve(config: settings.RouterSettings) -> int:
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    server = uvicorn.Server(uvicorn_config(config))
    server.run()
    return 0 if server.started else 1
