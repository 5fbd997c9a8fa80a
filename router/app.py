"""The router's FastAPI app: thin handlers over :mod:`streaming`, :mod:`views` and metrics."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import fastapi
import redis
from starlette import requests, responses, staticfiles

from asrpool.common import protocol
from asrpool.router import settings, streaming, views, wiring

STATIC = Path(__file__).parent / "static"  # the live page (index.html, live.js, vendor/)


def get_deps(connection: requests.HTTPConnection) -> wiring.Deps:
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

    @app.websocket("/pools/{pool}" + protocol.STREAMING_PATH)
    async def pool_stream(ws: fastapi.WebSocket, pool: str, d: wiring.Deps = Deps) -> None:
        await streaming.serve(ws, pool, d)

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
        try:
            pricing = views.Pricing(d.config.gpu_hour_price, d.config.gpus_per_pod)
            return responses.JSONResponse(await views.pools_json(d.redis, pricing))
        except redis.RedisError as exc:
            return responses.JSONResponse({"error": f"Redis unreachable: {exc}"}, status_code=503)

    @app.get("/", include_in_schema=False)
    async def live_page() -> responses.FileResponse:
        return responses.FileResponse(STATIC / "index.html")

    app.mount("/static", staticfiles.StaticFiles(directory=STATIC, check_dir=False), name="static")
    return app


async def ready(deps: wiring.Deps) -> responses.Response:
    """Ready while Redis answers: without it the router can admit nothing."""
    try:
        await deps.redis.ping()
    except redis.RedisError as exc:
        return responses.JSONResponse({"ready": False, "reason": str(exc)}, status_code=503)
    return responses.JSONResponse({"ready": True, "sessions": len(deps.sessions)})
