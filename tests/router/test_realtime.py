"""OpenAI's Realtime API (transcription mode) through a real router: the official
``openai`` SDK, unchanged, pointed at the router (``base_url=.../v1``, or
``.../pools/P/v1`` to name a pool), with the router's API keys as Bearer tokens. The
router admits the session as it admits a Kyutai stream, from the same slots, relays its
JSON events, and refuses in the SDK's own terms: ``error`` events it parses."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis.asyncio as aioredis
import websockets

from asrpool.common import auth, protocol
from asrpool.router import keys
from tests.router import support
from tests.router.test_pods import router_metric
from tests.server.test_realtime_sdk import SESSION, events_until, pcm16, strictly
from tests.support import kyutai_client, servers
from tests.support.redis_servers import RedisServer

POOL = "default"
KEY = "k-realtime-secret"
BROWSER_KEY = "k-realtime-page"  # a key that allows browsers
INTENT = {"intent": "transcription"}


@dataclasses.dataclass
class Platform:
    pod: servers.ServerProcess
    router: support.RouterProcess
    key_file: Path

    def client(self, key: str = KEY, base: str = "") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(api_key=key, base_url=f"{self.router.url}{base}/v1")


@pytest.fixture(scope="module")
def platform(module_redis: RedisServer,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    workdir: Path = tmp_path_factory.mktemp("realtime")
    key_file = workdir / "keys.json"
    key_file.write_text(json.dumps({"keys": [
        {"id": "rt", "sha256": auth.hash_key(KEY)},
        {"id": "page", "sha256": auth.hash_key(BROWSER_KEY), "browsers": True}]}))
    pod = support.pod(module_redis.url, workdir, "rt-pod", 2, POOL)
    router = support.router(module_redis.url, workdir, "--api-keys-file", str(key_file))
    try:
        pod.start()
        pod.wait_ready()
        router.start()
        support.wait_until(lambda: support.pods_in_view(router, key=KEY) == 1, 20,
                           "the pod in view")
        yield Platform(pod, router, key_file)
    finally:
        router.kill()
        pod.stop()


def _used(platform: Platform) -> int:
    return int(platform.pod.modules_info()["used_slots"])


async def _sessions(redis: aioredis.Redis) -> int:
    return len([name async for name in redis.scan_iter(keys.session(POOL, "*"))])


async def test_a_turn_through_the_router_holds_a_slot_and_gives_it_back(
        platform: Platform, redis: aioredis.Redis) -> None:
    """And its key is counted the turn's audio seconds, as a Kyutai stream's are."""
    billed = _key_audio_seconds(platform)
    audio = pcm16(2.0, seed=5)
    conn_manager = platform.client(base=f"/pools/{POOL}").realtime.connect(extra_query=INTENT)
    async with conn_manager as conn:
        (created,) = await events_until(conn, "session.created", 20)
        assert (_used(platform), await _sessions(redis)) == (1, 1)  # admitted as any stream
        await conn.session.update(session=SESSION)
        updated = await events_until(conn, "session.updated", 10)
        await conn.input_audio_buffer.append(audio=base64.b64encode(audio.tobytes()).decode())
        await conn.input_audio_buffer.commit()
        turn = await events_until(conn, "conversation.item.input_audio_transcription.completed")
    strictly([created, *updated, *turn])
    deltas = [e.delta for e in turn if e.type.endswith(".delta")]
    assert turn[-1].transcript == "".join(deltas)
    assert turn[-1].usage.seconds == 2.0
    await support.async_wait_until(
        lambda: _nothing_held(platform, redis), 20, "the slot and the session to be freed")
    assert _key_audio_seconds(platform) == pytest.approx(billed + 2.0)


def _key_audio_seconds(platform: Platform) -> float:
    return router_metric(platform.router, 'asrpool_router_key_audio_seconds_total{key="rt"}') \
        or 0.0


async def _nothing_held(platform: Platform, redis: aioredis.Redis) -> bool:
    return _used(platform) == 0 and await _sessions(redis) == 0


async def test_a_beta_client_gets_the_beta_protocol_through_the_router(
        platform: Platform) -> None:
    """The router passes ``OpenAI-Beta`` on: the pod answers in beta's shapes. (The
    beta SDK dials ``wss`` unless told the websocket base URL.)"""
    client = openai.AsyncOpenAI(api_key=KEY, base_url=f"{platform.router.url}/v1",
                                websocket_base_url=platform.router.url.replace("http", "ws", 1)
                                + "/v1")
    async with client.beta.realtime.connect(model="", extra_query=INTENT) as conn:
        (created,) = await events_until(conn, "transcription_session.created", 20)
    session = created.model_dump()["session"]
    assert session["input_audio_format"] == "pcm16"  # beta's field (GA's: audio.input.format)


async def test_a_bad_key_is_refused_before_the_upgrade(platform: Platform) -> None:
    with pytest.raises(Exception, match="401"):
        async with platform.client(key="k-wrong").realtime.connect(extra_query=INTENT) as conn:
            await conn.recv()


async def test_a_full_pool_is_an_error_event_both_protocols_share_the_slots(
        platform: Platform) -> None:
    """Two Kyutai streams hold both slots: the SDK's session gets ``busy`` as an
    ``error`` event it parses, and a close."""
    headers = {protocol.API_KEY_HEADER: KEY}
    holders = [await support.connect(platform.router.ws_url, headers) for _ in range(2)]
    try:
        for opened in holders:
            await kyutai_client.expect(opened.ws, "Ready")
        async with platform.client().realtime.connect(extra_query=INTENT) as conn:
            (error,) = await events_until(conn, "error", 30)
    finally:
        for opened in holders:
            await opened.ws.close()
    strictly([error])
    assert (error.error.code, error.error.type) == ("busy", "server_error")


async def test_an_unknown_pool_is_an_error_event(platform: Platform) -> None:
    async with platform.client(base="/pools/nowhere").realtime.connect(
            extra_query=INTENT) as conn:
        (error,) = await events_until(conn, "error", 10)
    strictly([error])
    assert error.error.code == "unknown_pool"
    assert "nowhere" in error.error.message


async def test_a_request_without_the_transcription_intent_is_400(platform: Platform) -> None:
    with pytest.raises(Exception, match="400"):
        async with platform.client().realtime.connect() as conn:
            await conn.recv()


async def test_a_lost_pod_ends_the_session_with_an_error_event_it_does_not_move(
        platform: Platform, module_redis: RedisServer, tmp_path: Path) -> None:
    """A session's turns live on its pod: when the pod dies the SDK hears ``pod_lost``
    (a Kyutai stream would move to the other pod of its pool, which is there)."""
    pool = "rt-lost"
    pods = [support.pod(module_redis.url, tmp_path, f"rt-lost-{n}", 1, pool) for n in (0, 1)]
    try:
        for pod in pods:
            pod.start()
        for pod in pods:
            pod.wait_ready()
        support.wait_until(lambda: support.pods_in_view(platform.router, pool, KEY) == 2, 20,
                           "both pods in view")
        async with platform.client(base=f"/pools/{pool}").realtime.connect(
                extra_query=INTENT) as conn:
            await events_until(conn, "session.created", 20)
            (serving,) = [pod for pod in pods if pod.modules_info()["used_slots"] == 1]
            serving.signal(signal.SIGKILL)
            (error,) = await events_until(conn, "error", 30)
        strictly([error])
        assert error.error.code == "pod_lost"
        (other,) = [pod for pod in pods if pod is not serving]
        assert other.modules_info()["used_slots"] == 0  # not moved there
    finally:
        for pod in pods:
            pod.stop()


async def test_a_browser_key_as_a_subprotocol_only_where_the_key_allows_browsers(
        platform: Platform) -> None:
    """Browsers cannot set headers: OpenAI's browser clients offer ``realtime`` and
    ``openai-insecure-api-key.KEY``. The router answers ``realtime``; a key that does not
    allow browsers is 401 that way (though it works as a Bearer token)."""
    url = platform.router.url.replace("http", "ws", 1) + "/v1/realtime?intent=transcription"
    offered = ["realtime", f"openai-insecure-api-key.{BROWSER_KEY}"]
    async with websockets.connect(url, subprotocols=offered, proxy=None) as ws:
        created = json.loads(await asyncio.wait_for(ws.recv(), 20))
        assert ws.subprotocol == "realtime"
    assert created["type"] == "session.created"
    with pytest.raises(websockets.InvalidStatus, match="401"):
        async with websockets.connect(url, subprotocols=["realtime",
                                                         f"openai-insecure-api-key.{KEY}"],
                                      proxy=None):
            pass


async def test_a_router_that_stops_tells_its_sessions_and_frees_their_slots(
        platform: Platform, module_redis: RedisServer, tmp_path: Path,
        redis: aioredis.Redis) -> None:
    """A router told to stop drains (here for a second): then its realtime sessions hear
    ``draining`` and close 1013 (they do not resume: another router takes them anew),
    and their slots are given back at once, not after a resume grace."""
    workdir = tmp_path / "draining"
    workdir.mkdir()
    stopping = support.router(module_redis.url, workdir, "--api-keys-file",
                              str(platform.key_file),
                              "--drain-grace-seconds", "1")
    stopping.start()
    try:
        support.wait_until(lambda: support.pods_in_view(stopping, key=KEY) == 1, 20,
                           "the pod in view")
        client = openai.AsyncOpenAI(api_key=KEY, base_url=f"{stopping.url}/v1")
        async with client.realtime.connect(extra_query=INTENT) as conn:
            await events_until(conn, "session.created", 20)
            assert _used(platform) == 1
            stopping.proc.send_signal(signal.SIGTERM)
            (error,) = await events_until(conn, "error", 30)
        strictly([error])
        assert error.error.code == "draining"
    finally:
        stopping.kill()
    await support.async_wait_until(lambda: _nothing_held(platform, redis), 10,
                                   "the slot and the session to be freed")
