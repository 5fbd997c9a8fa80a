"""The router's streaming fast path routes websockets as its FastAPI app's routes do."""

from __future__ import annotations

import pytest
from starlette import datastructures, routing

from asrpool.common import protocol, realtime_events
from asrpool.router import app, settings

STREAM = protocol.STREAMING_PATH
REALTIME = realtime_events.PATH
ROUTES = {"stream": STREAM, "pool_stream": STREAM, "realtime": REALTIME,
          "pool_realtime": REALTIME}
CASES = [
    (STREAM, b""),
    (STREAM, b"pool=fr"),
    (STREAM, b"pool=fr&pool=en"),
    (STREAM, b"pool=fr&pool="),
    (STREAM, b"pool=asr%2Fen&x=1"),
    ("/pools/en" + STREAM, b""),
    ("/pools/asr/en" + STREAM, b"pool=fr"),
    ("/pools/" + STREAM, b""),
    ("/pools/" + STREAM.lstrip("/"), b""),
    ("/pools" + STREAM, b""),
    (STREAM + "/", b""),
    ("/api/asr-streaming2", b""),
    ("/healthz", b""),
    ("/static/live.js", b""),
    (REALTIME, b"intent=transcription"),
    (REALTIME, b"intent=transcription&pool=fr"),
    ("/pools/en" + REALTIME, b"intent=transcription"),
    ("/pools/asr/en" + REALTIME, b""),
    ("/pools" + REALTIME, b""),
    (REALTIME + "/", b""),
    ("/v1/realtime2", b""),
]


def _as_the_app_routes(path: str, query: bytes) -> tuple[str | None, str | None]:
    """Which streaming route the app takes this websocket to (None: none), and the pool
    that handler is given (a path parameter, else the ``pool`` query parameter)."""
    routes = app.create_app(settings.RouterSettings()).routes
    scope = {"type": "websocket", "path": path, "query_string": query, "root_path": "",
             "headers": []}
    for route in routes:
        match, child = route.matches(scope)
        if match is routing.Match.FULL:
            streaming = ROUTES.get(getattr(route, "name", ""))
            params = child.get("path_params", {})
            return streaming, params.get("pool", datastructures.QueryParams(query).get("pool"))
    return None, None


@pytest.mark.parametrize(("path", "query"), CASES)
def test_the_fast_path_routes_as_the_app(path: str, query: bytes) -> None:
    expected = _as_the_app_routes(path, query)
    got = app.streaming_pool(path, query)
    assert got[0] == expected[0], f"{path}?{query.decode()}"
    if got[0]:
        assert got[1] == expected[1]


def test_the_cases_cover_both_routes_and_neither() -> None:
    routed = [_as_the_app_routes(*case) for case in CASES]
    assert {streaming for streaming, _ in routed} == {STREAM, REALTIME, None}
    assert {pool for streaming, pool in routed if streaming} >= {None, "fr", "en", "asr/en", ""}
