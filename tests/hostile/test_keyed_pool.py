"""A pool with API keys works through the router (real router, keyed pod, Redis): the
router checks the client's key and never forwards it; the pod trusts the router's pod
token instead, and refuses a client that comes to it directly."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets import exceptions as ws_exceptions

from asrpool.common import auth, protocol
from tests.router import support
from tests.support import kyutai_client, servers, streams
from tests.support.redis_servers import RedisServer

KEY = "team-a-secret"


def _key_file(workdir: Path) -> Path:
    path = workdir / "keys.json"
    path.write_text(json.dumps({"keys": [{"id": "team-a", "sha256": auth.hash_key(KEY)}]}))
    return path


@pytest.fixture(scope="module")
def keyed(module_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[support.RouterProcess, servers.ServerProcess]]:
    """One router and one pod with the same key file, as a keyed pool's (the pod has the
    pool's pod token too)."""
    workdir = tmp_path_factory.mktemp("keyed-pool")
    keys = str(_key_file(workdir))
    pod = support.pod(module_redis.url, workdir, "keyed-0", 2, "default", "--api-keys-file", keys)
    router = support.router(module_redis.url, workdir, "--api-keys-file", keys)
    with pod:
        pod.wait_ready()
        router.start()
        try:
            yield router, pod
        finally:
            router.kill()


async def _refused_status(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    with pytest.raises(ws_exceptions.InvalidStatus) as refused:
        await kyutai_client.connect(url, headers)
    return refused.value.response.status_code, bytes(refused.value.response.body or b"")


async def test_a_valid_key_through_the_router_gets_the_pods_words(
        keyed: tuple[support.RouterProcess, servers.ServerProcess]) -> None:
    router, pod = keyed
    pcm = streams.random_speechlike(2.0, 3)
    got = await support.transcribe(router.ws_url, pcm, {protocol.API_KEY_HEADER: KEY})
    assert support.is_marker(got[-1])
    pod.wait_idle()
    token = {protocol.POD_TOKEN_HEADER: support.POD_TOKEN}
    direct = await support.transcribe(pod.ws_url, pcm, token)
    assert kyutai_client.words(got) == kyutai_client.words(direct)
    assert any(m["type"] == "Word" for m in got), "the tiny model says nothing for this audio"


@pytest.mark.parametrize("headers", [{}, {protocol.API_KEY_HEADER: "not-a-key"}],
                         ids=["no-key", "bad-key"])
async def test_a_bad_key_is_refused_by_the_router_with_401(
        keyed: tuple[support.RouterProcess, servers.ServerProcess],
        headers: dict[str, str]) -> None:
    router, pod = keyed
    assert await _refused_status(router.ws_url, headers) == (401, protocol.UNAUTHORIZED.encode())
    assert pod.modules_info()["used_slots"] == 0


@pytest.mark.parametrize("headers", [{}, {protocol.API_KEY_HEADER: KEY}],
                         ids=["no-key", "good-key"])
async def test_a_client_that_bypasses_the_router_is_refused_by_the_pod(
        keyed: tuple[support.RouterProcess, servers.ServerProcess],
        headers: dict[str, str]) -> None:
    _, pod = keyed
    assert (await _refused_status(pod.ws_url, headers))[0] == 401
    assert pod.modules_info()["used_slots"] == 0


def test_the_pools_view_needs_a_key_when_keys_are_on(
        keyed: tuple[support.RouterProcess, servers.ServerProcess]) -> None:
    """/api/pools shows every pool's load: with keys on it is for key holders (it
    answered anyone). moshi-server's /api/modules_info stays open, as there."""
    router, _ = keyed
    assert support.http_get(router.url + "/api/pools") == (401, protocol.UNAUTHORIZED.encode())
    assert support.http_get(router.url + "/api/pools?auth_id=not-a-key")[0] == 401
    status, body = support.http_get(router.url + f"/api/pools?auth_id={KEY}")
    assert status == 200 and "default" in json.loads(body)["pools"]
    request = urllib.request.Request(router.url + "/api/pools",
                                     headers={protocol.API_KEY_HEADER: KEY})
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 200
    assert support.http_get(router.url + "/api/modules_info")[0] == 200
