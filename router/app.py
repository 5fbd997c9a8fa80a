"""The router's FastAPI app: thin handlers over :mod:`streaming`, :mod:`views` and metrics.

Served as :class:`StreamingFastPath` over the app: the streaming routes' websockets skip
FastAPI's routing, middleware and dependency solving, a fifth of a stream's setup CPU.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib import parse

import fastapi
import redis
from starlette import requests, responses, staticfiles
from starlette import types as asgi
from starlette import websockets as starlette_ws

from asrpool.common import builds, protocol, realtime_events
from asrpool.router import poolnames, refusals, settings, streaming, uploads, views, wiring

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"  # the live page (index.html, live.js, vendor/)
POOL_PREFIX = "/pools/"  # /pools/{pool}/api/asr-streaming names a pool in its path
# With an admin port (--admin-port), served there alone; the probes on both ports.
ADMIN_PATHS = frozenset({"/metrics", "/api/build_info", "/api/modules_info"})
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
STREAMING_PATHS = (protocol.STREAMING_PATH, realtime_events.PATH)  # Kyutai's, OpenAI's


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

    @app.websocket(POOL_PREFIX + "{pool:path}" + protocol.STREAMING_PATH)
    async def pool_stream(ws: fastapi.WebSocket, pool: str, d: wiring.Deps = Deps) -> None:
        await streaming.serve(ws, pool, d)

    @app.websocket(realtime_events.PATH)
    async def realtime(ws: fastapi.WebSocket, pool: str | None = None,
                       d: wiring.Deps = Deps) -> None:
        await streaming.serve_realtime(ws, pool, d)

    @app.websocket(POOL_PREFIX + "{pool:path}" + realtime_events.PATH)
    async def pool_realtime(ws: fastapi.WebSocket, pool: str, d: wiring.Deps = Deps) -> None:
        await streaming.serve_realtime(ws, pool, d)

    @app.post(protocol.STREAMING_PATH)
    async def upload(
        request: requests.Request, pool: str | None = None, d: wiring.Deps = Deps
    ) -> responses.Response:
        return await uploads.transcribe(request, pool, d)

    @app.get(protocol.STREAMING_PATH, include_in_schema=False)
    @app.get(POOL_PREFIX + "{pool:path}" + protocol.STREAMING_PATH, include_in_schema=False)
    async def upgrade_required() -> responses.Response:
        return responses.PlainTextResponse(protocol.UPGRADE_REQUIRED, status_code=426)

    @app.post(POOL_PREFIX + "{pool:path}" + protocol.STREAMING_PATH)
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
    async def pools(request: requests.Request, d: wiring.Deps = Deps) -> responses.Response:
        # Pod addresses and every pool's load: for key holders when keys are on.
        if streaming.authenticate(request, d.keyring) is None:
            return streaming.unauthorized(d)
        return await _redis_view(d, lambda got: got)

    @app.get("/", include_in_schema=False)
    async def live_page() -> responses.FileResponse:
        return responses.FileResponse(STATIC / "index.html")

    app.mount("/static", staticfiles.StaticFiles(directory=STATIC, check_dir=False), name="static")
    return app


def streaming_pool(path: str, query_string: bytes) -> tuple[str | None, str | None]:
    """Which streaming route ``path`` is (one of :data:`STREAMING_PATHS`, or None), and
    the pool it names as the app's routes read it (``None`` or empty: the default
    pool): ``/api/asr-streaming?pool=P`` (the last ``pool`` given) or
    ``/pools/P/api/asr-streaming``, and the same for ``/v1/realtime``."""
    for route in STREAMING_PATHS:
        if path == route:
            query = parse.parse_qs(query_string.decode("latin-1"), keep_blank_values=True)
            pools = query.get("pool")
            return route, pools[-1] if pools else None
        pooled = len(POOL_PREFIX) + len(route)
        if len(path) >= pooled and path.startswith(POOL_PREFIX) and path.endswith(route):
            return route, path[len(POOL_PREFIX):-len(route)]
    return None, None


class StreamingFastPath:
    """The streaming routes' websockets go straight to :func:`streaming.serve`, past
    FastAPI's routing, middleware and dependency solving (measured: a fifth of the
    router's CPU per stream opened and closed, ``bench/results/router-vs-nginx.json``);
    all else goes to ``app``, whose own streaming routes serve the same way."""

    def __init__(self, app: fastapi.FastAPI, admin_port: int | None = None) -> None:
        self.app = app
        self.admin_port = admin_port

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] in ("http", "websocket") and not self._served_here(scope):
            await _not_found(scope, receive, send)
            return
        if scope["type"] == "websocket":
            route, pool = streaming_pool(scope["path"], scope["query_string"])
            if route is not None:
                scope["app"] = self.app
                ws = starlette_ws.WebSocket(scope, receive, send)
                serve = streaming.serve if route == protocol.STREAMING_PATH else \
                    streaming.serve_realtime
                await serve(ws, pool, self.app.state.deps)
                return
        await self.app(scope, receive, send)


    def _served_here(self, scope: asgi.Scope) -> bool:
        """With an admin port, each port serves its own paths (the probes, both)."""
        if self.admin_port is None or scope["path"] in PROBE_PATHS:
            return True
        on_admin = (scope.get("server") or ("", None))[1] == self.admin_port
        return (scope["path"] in ADMIN_PATHS) == on_admin


async def _not_found(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
    """404 for a path this port does not serve (a websocket: refused before its upgrade)."""
    answer = responses.PlainTextResponse("not found on this port", status_code=404)
    if scope["type"] == "websocket":
        await starlette_ws.WebSocket(scope, receive, send).send_denial_response(answer)
    else:
        await answer(scope, receive, send)


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
    """Ready while Redis answers (without it the router can admit nothing) and until
    SIGTERM (router.draining)."""
    if deps.draining:
        refusal = refusals.router_draining()
        body = {"ready": False, "error": refusal.code, "message": refusal.message,
                "sessions": len(deps.sessions)}
        return responses.JSONResponse(body, status_code=503)
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
