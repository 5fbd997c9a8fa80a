"""The router's FastAPI app: thin handlers over :mod:`streaming`, :mod:`views` and metrics."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import fastapi
import redis
from starlette import requests, responses, staticfiles

from asrpool.common import builds, protocol
from asrpool.router import poolnames, refusals, settings, streaming, uploads, views, wiring

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"  # the live page (index.html, live.js, vendor/)


async def get_deps(connection: requests.HTTPConnection) -> wiring.Deps:
    """Async, so that FastAPI calls it on the loop: a plain function would be run in its
    thread pool, a thread hand-off (and GIL contention) for every request and stream."""
    deps: wiring.Deps = connection.app.state.deps
    return deps


Deps = fastapi.Depends(get_deps)


def create_app(config: settings.RouterSettings, deps: wiring.Deps | None = None) -> fastapi.FastAPI:
    """The app; ``deps`` are built in the lifespan from ``config`` unless given."""

    @contextlib.asynccontextmanager
    async def lifespan(app: fastapi.FastAPI) -> AsyncIterator[None]:
        async with wiring.running(deps or wiring.build(config)) as built:
            app.state.deps = built
            yield

    app = fastapi.FastAPI(title="asrpool router", lifespan=lifespan)

    @app.websocket(protocol.STREAMING_PATH)
    async def stream(ws: fastapi.WebSocket, pool: str | None = None, d: wiring.Deps = Deps) -> None:
        await streaming.serve(ws, pool, d)

    @app.websocket("/pools/{pool:path}" + protocol.STREAMING_PATH)
    async def pool_stream(ws: fastapi.WebSocket, pool: str, d: wiring.Deps = Deps) -> None:
        await streaming.serve(ws, pool, d)

    @app.post(protocol.STREAMING_PATH)
    async def upload(
        request: requests.Request, pool: str | None = None, d: wiring.Deps = Deps
    ) -> responses.Response:
        return await uploads.transcribe(request, pool, d)

    @app.get(protocol.STREAMING_PATH, include_in_schema=False)
    @app.get("/pools/{pool:path}" + protocol.STREAMING_PATH, include_in_schema=False)
    async def upgrade_required() -> responses.Response:
        return responses.PlainTextResponse(protocol.UPGRADE_REQUIRED, status_code=426)

    @app.post("/pools/{pool:path}" + protocol.STREAMING_PATH)
    async def pool_upload(
        request: requests.Request, pool: str, d: wiring.Deps = Deps
    ) -> responses.Response:
        return await uploads.transcribe(request, pool, d)

    @app.get("/api/build_info")
    async def build_info() -> dict[str, str]:
        return builds.build_info()

    @app.get("/api/modules_info")
    async def modules_info(d: wiring.Deps = Deps) -> responses.Response:
        default = poolnames.resolve(d.config.default_pool, d.config.pool_namespace)
        return await _redis_view(d, lambda got: views.modules_info(got, default or ""))

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/readyz")
    async def readyz(d: wiring.Deps = Deps) -> responses.Response:
        return await ready(d)

    @app.get("/metrics")
    async def metrics(d: wiring.Deps = Deps) -> responses.Response:
        return responses.Response(d.meters.exposition(), media_type="text/plain; version=0.0.4")

    @app.get("/api/pools")
    async def pools(d: wiring.Deps = Deps) -> responses.Response:
        return await _redis_view(d, lambda got: got)

    @app.get("/", include_in_schema=False)
    async def live_page() -> responses.FileResponse:
        return responses.FileResponse(STATIC / "index.html")

    app.mount("/static", staticfiles.StaticFiles(directory=STATIC, check_dir=False), name="static")
    return app


async def _redis_view(
    deps: wiring.Deps, shape: Callable[[dict[str, Any]], Any]
) -> responses.Response:
    """The pools as Redis has them, in ``shape``; 503 while Redis does not answer."""
    try:
        pricing = views.Pricing(deps.config.gpu_hour_price, deps.config.gpus_per_pod)
        return responses.JSONResponse(shape(await views.pools_json(deps.redis, pricing)))
    except redis.RedisError as exc:
        return _unavailable(deps, "view", exc)


async def ready(deps: wiring.Deps) -> responses.Response:
    """Ready while Redis answers: without it the router can admit nothing."""
    try:
        await deps.redis.ping()
    except redis.RedisError as exc:
        return _unavailable(deps, "ready", exc)
    return responses.JSONResponse({"ready": True, "sessions": len(deps.sessions)})


def _unavailable(deps: wiring.Deps, what: str, exc: redis.RedisError) -> responses.Response:
    """503 that names no address or Redis error (those go to the log, once a call)."""
    deps.meters.redis_errors.labels(what).inc()
    log.warning("%s: Redis unreachable: %s", what, exc)
    refusal = refusals.unavailable()
    body = {"ready": False, "error": refusal.code, "message": refusal.message}
    return responses.JSONResponse(body, status_code=503)
