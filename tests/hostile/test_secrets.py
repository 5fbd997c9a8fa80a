"""Secrets stay secret: no API key in logs, one 401 for every failed check, no ERROR line
for a refused handshake, no pod address or Redis error for unauthenticated callers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from websockets import exceptions as ws_exceptions

from asrpool.common import auth, protocol
from asrpool.common.processes import free_port
from asrpool.router import tokens
from tests.router import support
from tests.support import kyutai_client, redis_servers, servers

KEY = "sekrit-key-123"
WRONG = "wrong-key-456"
POD_TOKEN = "pod-token-789"


def _key_file(workdir: Path) -> Path:
    path = workdir / "keys.json"
    path.write_text(json.dumps({"keys": [{"id": "good", "sha256": auth.hash_key(KEY)}]}))
    return path


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerProcess]:
    workdir = tmp_path_factory.mktemp("secret-pod")
    with servers.ServerProcess(workdir, batch_size=1, args=[
            "--api-keys-file", str(_key_file(workdir))],
            env={"ASRPOOL_POD_TOKEN": POD_TOKEN}) as server:
        server.wait_ready()
        yield server


async def _status(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    try:
        ws = await kyutai_client.connect(url, headers)
    except ws_exceptions.InvalidStatus as exc:
        return exc.response.status_code, bytes(exc.response.body or b"")
    await kyutai_client.expect(ws, "Ready")
    await ws.close()
    return 101, b""


@pytest.mark.parametrize(("query", "headers"), [
    (f"?auth_id={KEY}", {}),  # no pod token
    (f"?auth_id={WRONG}", {}),  # a wrong key, no pod token
    (f"?auth_id={KEY}", {"asrpool-pod-token": POD_TOKEN[:-1] + "\u00b2"}),  # not ASCII
    (f"?auth%5Fid={KEY}", {"asrpool-pod-token": "x" * 500}),
])
async def test_the_pod_refuses_with_one_401_and_logs_no_secret(
        pod: servers.ServerProcess, query: str, headers: dict[str, str]) -> None:
    status, body = await _status(pod.ws_url + query, headers)
    assert (status, body) == (401, protocol.UNAUTHORIZED.encode())
    assert (await _status(f"{pod.ws_url}?auth_id={WRONG}", {"asrpool-pod-token": POD_TOKEN}))[0] \
        == 101  # the router's token: the key was the router's to check
    log = pod.log()
    assert KEY not in log and WRONG not in log
    assert "auth_id=<redacted>" in log or "auth%5Fid=<redacted>" in log
    assert "ERROR" not in log and "Traceback" not in log


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[support.RouterProcess]:
    workdir = tmp_path_factory.mktemp("secret-router")
    redis = redis_servers.RedisServer(workdir)
    redis.start()
    proc = support.RouterProcess(redis.url, workdir, "--api-keys-file", str(_key_file(workdir)),
                                 "--log-level", "info")
    proc.start()
    yield proc
    proc.terminate()
    redis.stop()


async def test_the_router_refuses_with_one_401_and_logs_no_secret(
        router: support.RouterProcess) -> None:
    status, body = await _status(f"{router.ws_url}?auth_id={WRONG}", {})
    assert (status, body) == (401, protocol.UNAUTHORIZED.encode())
    log = router.log()
    assert WRONG not in log and "auth_id=<redacted>" in log
    assert "ERROR" not in log and "Traceback" not in log


async def test_the_router_logs_no_resume_token_from_a_browsers_query(
        router: support.RouterProcess) -> None:
    """A browser sends its resume token in the query: the router's log never shows it."""
    token = tokens.mint("default", tokens.new_session_id()).text
    ws = await kyutai_client.connect(
        f"{router.ws_url}?auth_id={KEY}&asrpool-resume-token={token}", {})
    error = await kyutai_client.receive(ws, 10)
    assert error["code"] == "bad_resume_token", error
    await ws.close()
    log = router.log()
    assert token not in log and token.split(".")[-1] not in log
    assert "asrpool-resume-token=<redacted>" in log


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_views_show_no_pod_address_or_redis_error(tmp_path: Path) -> None:
    dead_port = free_port()
    router = support.RouterProcess(f"redis://127.0.0.1:{dead_port}/0", tmp_path)
    router.start()
    try:
        for path in ("/readyz", "/api/pools", "/api/modules_info"):
            status, body = _get(router.url + path)
            assert status == 503, path
            assert str(dead_port) not in body and "refused" not in body.lower(), body
            assert "unavailable" in body, body
    finally:
        router.terminate()


async def test_the_pools_view_shows_no_pod_address(
        tmp_path: Path, redis_server: redis_servers.RedisServer) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    await support.beat(client, "a", port=45678)
    await client.aclose()
    router = support.RouterProcess(redis_server.url, tmp_path)
    router.start()
    try:
        status, body = _get(router.url + "/api/pools")
    finally:
        router.terminate()
    assert status == 200
    assert json.loads(body)["pools"]["default"]["pods"][0]["pod_id"] == "a"
    assert "45678" not in body
