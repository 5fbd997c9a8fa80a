"""Bad input against a real router process: each gets a clear error, nothing else is touched.

One router process and one Redis serve the whole module; each test uses its own pool.
Pods here are heartbeats only: these refusals all happen before any pod is dialled.
"""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import websockets

from asrpool.common import auth, protocol, waiting
from asrpool.router import keys, tokens
from tests.router import support
from tests.support.redis_servers import RedisServer

KEYS = {"good": "k-good-secret", "limited": "k-limited-secret", "scoped": "k-scoped-secret"}


@pytest.fixture(scope="module")
def router(
    module_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[support.RouterProcess]:
    workdir = tmp_path_factory.mktemp("router")
    key_file = workdir / "keys.json"
    key_file.write_text(
        json.dumps(
            {
                "keys": [
                    {"id": "good", "sha256": auth.hash_key(KEYS["good"])},
                    {"id": "limited", "sha256": auth.hash_key(KEYS["limited"]), "max_streams": 1},
                    {"id": "scoped", "sha256": auth.hash_key(KEYS["scoped"]),
                     "pools": ["scoped-pool", "team/*"]},
                ]
            }
        )
    )
    proc = support.RouterProcess(module_redis.url, workdir, "--api-keys-file", str(key_file),
                                 "--gpu-hour-price", "2.5", "--gpus-per-pod", "2")
    proc.start()
    yield proc
    proc.terminate()




def with_key(name: str = "good") -> dict[str, str]:
    return {protocol.API_KEY_HEADER: KEYS[name]}


async def refusal(url: str, headers: dict[str, str]) -> tuple[dict[str, object], int | None]:
    """The Error a refused stream gets, and the close code after it."""
    opened = await support.connect(url, headers)
    error = await support.first_message(opened.ws)
    rest = await support.until_closed(opened.ws)
    assert rest == []
    assert opened.ws.close_code is not None
    return error, opened.ws.close_code


async def test_missing_key_is_401_before_the_upgrade(router: support.RouterProcess) -> None:
    with pytest.raises(websockets.InvalidStatus) as caught:
        await support.connect(router.ws_url)
    assert caught.value.response.status_code == 401


async def test_bad_key_is_401_before_the_upgrade(router: support.RouterProcess) -> None:
    with pytest.raises(websockets.InvalidStatus) as caught:
        await support.connect(router.ws_url, {protocol.API_KEY_HEADER: "wrong"})
    assert caught.value.response.status_code == 401
    with pytest.raises(websockets.InvalidStatus):
        await support.connect(router.ws_url + "?auth_id=wrong")


async def test_key_in_the_query_is_accepted(
    router: support.RouterProcess, redis: aioredis.Redis
) -> None:
    await support.beat(redis, "q-full", total=1, free=0, pool="query-pool")
    error, _ = await refusal(router.ws_url + f"?pool=query-pool&auth_id={KEYS['good']}", {})
    assert error["code"] == "busy"


async def test_unknown_pool(router: support.RouterProcess) -> None:
    error, close = await refusal(router.ws_url + "?pool=no-such-pool", with_key())
    assert error == {
        "type": "Error",
        "message": "unknown pool 'no-such-pool'",
        "code": "unknown_pool",
    }
    assert close == 1008


async def test_malformed_pool_name(router: support.RouterProcess) -> None:
    error, _ = await refusal(
        router.url.replace("http", "ws") + "/pools/BAD:name/api/asr-streaming", with_key()
    )
    assert error["code"] == "unknown_pool"


async def test_no_free_slot_is_the_busy_error(
    router: support.RouterProcess, redis: aioredis.Redis
) -> None:
    await support.beat(redis, "full", total=2, free=0, pool="full-pool")
    await support.beat(redis, "draining", total=2, pool="full-pool", draining=True)
    error, close = await refusal(
        router.url.replace("http", "ws") + "/pools/full-pool/api/asr-streaming", with_key()
    )
    assert error == {"type": "Error", "message": protocol.BUSY_MESSAGE, "code": "busy"}
    assert close == 1013


async def test_key_over_its_stream_limit(
    router: support.RouterProcess, redis: aioredis.Redis
) -> None:
    await support.beat(redis, "roomy", total=8, pool="limit-pool")
    # the key already holds one stream through some router
    await redis.zadd(keys.key_sessions("limited"), {"other-session": 10**13})
    try:
        error, close = await refusal(router.ws_url + "?pool=limit-pool", with_key("limited"))
    finally:
        await redis.delete(keys.key_sessions("limited"))
    assert error["code"] == "key_limit" and "'limited'" in str(error["message"])
    assert close == 1008
    assert await redis.zcard(keys.pod_sessions("limit-pool", "roomy")) == 0  # nothing reserved


async def test_forged_resume_token(router: support.RouterProcess) -> None:
    for forged in ("garbage", tokens.mint("default", tokens.new_session_id()).text):
        error, close = await refusal(
            router.ws_url, {**with_key(), protocol.RESUME_TOKEN_HEADER: forged}
        )
        assert error == {
            "type": "Error",
            "message": "unknown or expired resume token",
            "code": "bad_resume_token",
        }
        assert close == 1008


async def test_a_malformed_resume_count_is_refused_before_anything_is_claimed(
        router: support.RouterProcess, redis: aioredis.Redis) -> None:
    token = tokens.mint("default", tokens.new_session_id())
    with pytest.raises(websockets.InvalidStatus) as caught:
        await support.connect(router.ws_url, {
            **with_key(), protocol.RESUME_TOKEN_HEADER: token.text,
            protocol.RESUME_RECEIVED_HEADER: "12a"})
    assert caught.value.response.status_code == 400
    assert b"asrpool-resume-received must be a count of messages" in caught.value.response.body
    assert await redis.exists(keys.session("default", token.session_id)) == 0


async def test_an_old_routers_resume_token_is_told_it_is_old(
        router: support.RouterProcess) -> None:
    """Tokens minted before they named their pool (``SID.SECRET``) are refused once, on
    upgrade, saying why, under the usual code and close code."""
    old = tokens.mint("default", tokens.new_session_id()).text.partition(".")[2]
    assert tokens.parse(old) is None and tokens.is_old(old)
    error, close = await refusal(router.ws_url, {**with_key(), protocol.RESUME_TOKEN_HEADER: old})
    assert error == {"type": "Error", "code": "bad_resume_token", "message":
                     "resume token from before a router upgrade (it names no pool); start a"
                     " new stream"}
    assert close == 1008


async def test_garbage_before_the_upgrade(router: support.RouterProcess) -> None:
    reply = await asyncio.to_thread(_send_raw, router.port, b"\x16\x03\x01garbage\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400")
    reply = await asyncio.to_thread(
        _send_raw, router.port, b"GET /api/asr-streaming HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert reply.split(b" ")[1] in (b"400", b"404", b"426")
    assert support.http_get(router.url + "/healthz")[0] == 200


def _send_raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks):
                break
        return b"".join(chunks)


async def test_pools_view_and_metrics(router: support.RouterProcess, redis: aioredis.Redis) -> None:
    await support.beat(redis, "viewed", total=4, free=3, pool="view-pool")
    assert support.http_get(router.url + "/api/pools")[0] == 401  # keys are on here
    status, body = support.http_get(router.url + f"/api/pools?auth_id={KEYS['good']}")
    assert status == 200
    pool = json.loads(body)["pools"]["view-pool"]
    assert pool["total_slots"] == 4 and pool["free_slots"] == 3
    assert pool["pods"][0]["pod_id"] == "viewed"
    assert pool["streams"] == 1  # one pod of 2 GPUs at $2.5 an hour, one stream
    assert pool["cost"] == {"gpus": 2, "cents_per_hour": 500, "cents_per_audio_hour": 500}
    status, body = support.http_get(router.url + "/metrics")
    assert status == 200
    assert b"asrpool_router_gpu_hour_price_dollars 2.5" in body
    assert b"asrpool_router_gpus_per_pod 2.0" in body
    for name in (
        "asrpool_router_sessions_open",
        "asrpool_router_rejections_total",
        "asrpool_router_admission_seconds",
        "asrpool_router_relayed_messages_total",
    ):
        assert name.encode() in body
    assert support.http_get(router.url + "/readyz")[0] == 200


def test_flags_win_over_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from asrpool import cli
    from asrpool.router import cli as router_cli

    monkeypatch.setenv("ASRPOOL_POLICY", "spread")
    monkeypatch.setenv("ASRPOOL_QUEUE_TIMEOUT_SECONDS", "2.5")
    args = cli.build_parser().parse_args(["route", "--policy", "pack", "--port", "9999"])
    config = router_cli.settings_from(args)
    assert (config.policy, config.queue_timeout_seconds, config.port) == ("pack", 2.5, 9999)
    assert cli.main(["route", "--api-keys-file", str(tmp_path / "missing")]) == 2


async def test_expired_resume_token(router: support.RouterProcess, redis: aioredis.Redis) -> None:
    """A token whose session record has run out its grace is refused like a forged one."""
    token = tokens.mint("default", tokens.new_session_id())
    record = keys.session("default", token.session_id)
    await redis.hset(
        record,
        mapping={
            "token_sha": token.sha256,
            "pod": "p",
            "address": "127.0.0.1:1",
            "key_id": "good",
            "pod_resume_token": "t",
            "pool": "default",
            "started_ms": "0",
        },
    )
    await redis.pexpire(record, 100)
    await support.async_wait_until(lambda: _gone(redis, record), 5, "the record to expire")
    error, close = await refusal(
        router.ws_url, {**with_key(), protocol.RESUME_TOKEN_HEADER: token.text}
    )
    assert (error["code"], close) == ("bad_resume_token", 1008)


async def _gone(redis: aioredis.Redis, key: str) -> bool:
    return await redis.exists(key) == 0


def test_the_live_page_is_served(router: support.RouterProcess) -> None:
    status, body = support.http_get(router.url + "/")
    assert status == 200 and b"<html" in body.lower()
    assert support.http_get(router.url + "/static/live.js")[0] == 200
    assert support.http_get(router.url + "/static/nothing-here.js")[0] == 404


async def test_a_key_scoped_to_pools_is_refused_others_with_403_and_no_demand(
    router: support.RouterProcess, redis: aioredis.Redis
) -> None:
    """Before the upgrade (and before an upload's body is read), naming the key and the
    pools it may use; nothing reaches Redis, so the pool sees no demand from it."""
    await support.beat(redis, "other-full", total=1, free=0, pool="other-pool")
    await support.beat(redis, "scoped-full", total=1, free=0, pool="scoped-pool")
    with pytest.raises(websockets.InvalidStatus) as caught:
        await support.connect(router.ws_url + "?pool=other-pool", with_key("scoped"))
    assert caught.value.response.status_code == 403
    assert caught.value.response.body == (
        b"API key scoped may not use pool other-pool (it may use: scoped-pool, team/*)")
    assert (await waiting.read(redis, "other-pool", 60)).refused == 0
    error, _ = await refusal(router.ws_url + "?pool=scoped-pool", with_key("scoped"))
    assert error["code"] == "busy"  # its own pool: admitted as far as the pool's room
    error, _ = await refusal(router.ws_url + "?pool=team/any", with_key("scoped"))
    assert error["code"] == "unknown_pool"  # a pool of its namespace: past the scope
    status, body = await asyncio.to_thread(
        _post, router.url + "/api/asr-streaming?pool=other-pool", with_key("scoped"))
    assert (status, body) == (
        403, b"API key scoped may not use pool other-pool (it may use: scoped-pool, team/*)")
    resume = tokens.mint("other-pool", tokens.new_session_id()).text
    with pytest.raises(websockets.InvalidStatus) as caught:
        await support.connect(router.ws_url, {**with_key("scoped"),
                                              protocol.RESUME_TOKEN_HEADER: resume})
    assert caught.value.response.status_code == 403


def _post(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=b"RIFF" * 1000, method="POST",
                                     headers={**headers, "Content-Type": "audio/wav"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def test_uploads_count_as_new_streams(module_redis: RedisServer, tmp_path: Path) -> None:
    """A POST is a stream: over the new streams per second of its address (and of its
    key) it is HTTP 429 before its body is read, as a websocket's would be."""
    key_file = tmp_path / "keys.json"
    key_file.write_text(json.dumps({"keys": [{"id": "good",
                                              "sha256": auth.hash_key(KEYS["good"])}]}))
    limited = support.RouterProcess(module_redis.url, tmp_path, "--api-keys-file", str(key_file),
                                    "--new-streams-per-second", "0.1", "--new-streams-burst", "1")
    limited.start()
    try:
        statuses = [(await asyncio.to_thread(_post, limited.url + "/api/asr-streaming?pool=nope",
                                             with_key()))[0] for _ in range(2)]
        assert statuses == [404, 429]  # the first is admitted as far as its (unknown) pool
        status, body = await asyncio.to_thread(
            _post, limited.url + "/api/asr-streaming?pool=nope", with_key())
        assert status == 429 and b"over 0.1 new streams per second from 127.0.0.1" in body
    finally:
        limited.terminate()
