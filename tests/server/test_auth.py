"""API keys and the pod token: a bad one is HTTP 401 before the upgrade. A pod with a
pod token admits only requests carrying it (the routers', which checked the API key),
without asking for a key; a pod without one checks the key itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest
from websockets import exceptions as ws_exceptions

from asrpool.common import auth
from tests.support import kyutai_client, servers

KEY = "secret-key-a"
POD_TOKEN = "router-shared-secret"


def _keyed(factory: pytest.TempPathFactory, env: dict[str, str] | None = None
           ) -> Iterator[servers.ServerProcess]:
    workdir = factory.mktemp("keyed")
    keys = workdir / "keys.yaml"
    keys.write_text(f"keys:\n  - id: team-a\n    sha256: {auth.hash_key(KEY)}\n")
    with servers.ServerProcess(workdir, batch_size=1, args=["--api-keys-file", str(keys)],
                               env=env) as server:
        server.wait_ready()
        yield server


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerProcess]:
    """API keys and a pod token, as the pods of a keyed pool."""
    yield from _keyed(tmp_path_factory, {"ASRPOOL_POD_TOKEN": POD_TOKEN})


@pytest.fixture(scope="module")
def key_only_server(tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[servers.ServerProcess]:
    """API keys and no pod token: an ``asrpool serve`` that clients reach directly."""
    yield from _keyed(tmp_path_factory)


async def _status_of(server: servers.ServerProcess, query: str,
                     headers: dict[str, str]) -> int:
    server.wait_idle()
    url = server.ws_url + query
    try:
        async with await kyutai_client.connect(url, headers) as ws:
            await kyutai_client.expect(ws, "Ready")
            return 101
    except ws_exceptions.InvalidStatus as exc:
        return exc.response.status_code


@pytest.mark.parametrize(("headers", "query", "status"), [
    ({"kyutai-api-key": KEY}, "", 101),
    ({}, f"?auth_id={KEY}", 101),
    ({}, "", 401),
    ({"kyutai-api-key": "wrong"}, "", 401),
    ({}, "?auth_id=wrong", 401),
], ids=["header", "query", "missing", "wrong-header", "wrong-query"])
async def test_api_keys(key_only_server: servers.ServerProcess, headers: dict[str, str],
                        query: str, status: int) -> None:
    assert await _status_of(key_only_server, query, headers) == status


@pytest.mark.parametrize(("token", "key", "status"), [
    (POD_TOKEN, None, 101),  # a router: it checked the key, it does not forward it
    (POD_TOKEN, "wrong", 101),  # ... nor is one it might pass on looked at
    (None, KEY, 401),  # a client that bypasses the routers, even with a good key
    (None, None, 401),
    ("wrong", KEY, 401),
], ids=["router", "router-ignores-key", "direct-with-key", "direct", "wrong-token"])
async def test_pod_token(keyed_server: servers.ServerProcess, token: str | None,
                         key: str | None, status: int) -> None:
    headers = {name: value for name, value in
               (("asrpool-pod-token", token), ("kyutai-api-key", key)) if value is not None}
    assert await _status_of(keyed_server, "", headers) == status
    if status == 401:
        assert keyed_server.modules_info()["used_slots"] == 0


def test_bad_key_file_is_refused_at_start(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys: nope\n")
    server = servers.ServerProcess(tmp_path, args=["--api-keys-file", str(keys)]).start()
    assert server.wait(60) != 0
    assert "keys" in server.log()


def test_an_empty_or_unset_secret_is_no_secret() -> None:
    assert auth.revealed(None) is None
    assert auth.revealed(pydantic.SecretStr("")) is None
    assert auth.revealed(pydantic.SecretStr("tok")) == "tok"
