"""Running the router app under uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from asrpool.router import app, settings, wiring


def uvicorn_config(config: settings.RouterSettings) -> uvicorn.Config:
    # The sans-I/O websockets protocol pauses reading until the app has taken each
    # message and awaits the socket's drain on sends: backpressure in both directions.
    # Frames between max_message_bytes and ws_max_size get a clear Error from the
    # router; larger ones a 1009 close from uvicorn before they are buffered.
    # Dependencies are built here, not in the lifespan, so that a bad key file fails the
    # command (exit 2) before uvicorn starts; they connect lazily inside its loop.
    return uvicorn.Config(
        app.create_app(config, wiring.build(config)),
        host=config.host,
        port=config.port,
        ws="websockets-sansio",
        ws_max_size=4 * config.max_message_bytes,
        ws_per_message_deflate=False,
        # A client whose stream is held back by a slow pod is not read meanwhile, so its
        # pongs wait behind its audio: be patient before calling it dead.
        ws_ping_interval=20,
        ws_ping_timeout=60,
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
