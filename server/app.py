"""The server pod's ASGI app: ``create_app(settings, deps)``, routes of one line each."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import fastapi
from fastapi import responses

from asrpool.common import auth, builds, protocol, redis_clients
from asrpool.server import enginechild, pacing, pods, realtimews, settings, streaming, uploads
from asrpool.server import metrics as metrics_mod

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from asrpool.server import stepping


def build_deps(config: settings.ServerSettings) -> pods.Deps:
    """The real dependencies: the model named in the settings (or its paced stand-in),
    Redis, the key file. A bad paced engine's file is refused here, before the pod starts
    (``pacing.ProfileError``), as a bad key file is."""
    if config.paced_engine is not None:
        pacing.read_profile(config.paced_engine)
    return pods.Deps(
        engine_factory=engine_factory(config),
        redis=_connect_redis(config),
        keys=auth.load_keys(config.api_keys_file) if config.api_keys_file else None,
    )


def _connect_redis(config: settings.ServerSettings) -> aioredis.Redis | None:
    if not config.redis_url:
        return None
    return redis_clients.connect(config.redis_url, config.redis_timeout_seconds,
                                 password=config.redis_password_value())


def engine_factory(config: settings.ServerSettings) -> Callable[[], stepping.Engine]:
    """Builds the engine the settings name (at their batch size, once it is known)."""
    return lambda: enginechild.build_engine(enginechild.EngineSpec.of(config))


def create_app(config: settings.ServerSettings, deps: pods.Deps) -> fastapi.FastAPI:
    pod = pods.Pod(config, deps)

    @contextlib.asynccontextmanager
    async def lifespan(_: fastapi.FastAPI) -> AsyncIterator[None]:
        await pod.start()
        try:
            yield
        finally:
            await pod.shutdown()

    app = fastapi.FastAPI(title="asrpool server pod", lifespan=lifespan)
    app.state.pod = pod

    @app.websocket(protocol.STREAMING_PATH)
    async def asr_streaming(websocket: fastapi.WebSocket) -> None:
        await streaming.serve(websocket, pod)

    @app.websocket(realtimews.PATH)
    async def openai_realtime(websocket: fastapi.WebSocket) -> None:
        await realtimews.serve(websocket, pod)

    @app.get("/healthz")
    def healthz() -> responses.Response:
        return _status(pod.state is not pods.State.FAILED, pod.state.value)

    @app.get("/startupz")
    def startupz() -> responses.Response:
        """200 once the model is loaded and warmed (the startup probe's budget is the
        model load); it stays 200 while the pod drains."""
        return _status(pod.started, pod.state.value)

    @app.get("/readyz")
    def readyz() -> responses.Response:
        return _status(pod.ready, pod.state.value)

    @app.get("/metrics")
    def metrics() -> responses.Response:
        return responses.Response(pod.metrics.exposition(), media_type=metrics_mod.CONTENT_TYPE)

    @app.post(protocol.STREAMING_PATH)
    async def asr_post(request: fastapi.Request) -> responses.Response:
        return await _transcribe(pod, request)

    @app.delete(protocol.STREAMING_PATH)
    async def asr_end(request: fastapi.Request) -> responses.Response:
        # On the event loop: it sets the stream's asyncio future (a plain def would run
        # in a worker thread, whose call_soon does not wake an idle loop).
        return _end(pod, request)

    @app.get(protocol.STREAMING_PATH, include_in_schema=False)
    def asr_get() -> responses.Response:
        return responses.PlainTextResponse(protocol.UPGRADE_REQUIRED, status_code=426)

    @app.get("/api/modules_info")
    def modules_info() -> list[dict[str, str]]:
        return pod.modules_info()

    @app.get("/api/build_info")
    def build_info() -> dict[str, str]:
        return builds.build_info()

    return app


async def _transcribe(pod: pods.Pod, request: fastapi.Request) -> responses.Response:
    refusal = pod.gate.refusal(request.headers, request.query_params)
    if refusal is not None:
        pod.count_error(protocol.ErrorCode.UNAUTHORIZED)
        return responses.PlainTextResponse(refusal, status_code=401)
    try:
        words = await uploads.transcribe(pod, request)
    except uploads.Refused as exc:
        return responses.PlainTextResponse(exc.message, status_code=exc.status)
    return responses.JSONResponse(words)


def _end(pod: pods.Pod, request: fastapi.Request) -> responses.Response:
    """End the stream that the ``asrpool-resume-token`` header names, now, as if its
    client had closed: its slot is freed whatever audio it holds. A router asks this
    when its client closed cleanly but the pod, holding back a fast sender, had not yet
    read the close that came behind that audio (dropping the link instead would keep
    the slot for a resume). 204, or 404 for an unknown token."""
    refusal = pod.gate.refusal(request.headers, request.query_params)
    if refusal is not None:
        pod.count_error(protocol.ErrorCode.UNAUTHORIZED)
        return responses.PlainTextResponse(refusal, status_code=401)
    token = request.headers.get(protocol.RESUME_TOKEN_HEADER, "")
    if not pod.end(token):
        return responses.PlainTextResponse("unknown or expired resume token", status_code=404)
    return responses.Response(status_code=204)


def _status(ok: bool, state: str) -> responses.Response:
    return responses.JSONResponse({"state": state}, status_code=200 if ok else 503)
