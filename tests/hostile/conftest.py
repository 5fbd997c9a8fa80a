"""Fixtures of the hostile-client suite."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from asrpool.common import auth, protocol
from asrpool.router import keys
from asrpool.server import models
from tests.router import support
from tests.support import redis_servers, servers


@pytest.fixture(scope="session")
def tiny() -> models.LoadedModel:
    return models.load_model("tiny")


# One pod (2 slots) behind one router with a Redis, with short deadlines so that each
# attack is over in seconds; shared by the I/O tests of this package.
SEND_TIMEOUT_S = 1.0
HANDSHAKE_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 24
API_KEY = "hostile-key"


@dataclasses.dataclass
class Platform:
    redis: redis_servers.RedisServer
    pod: servers.ServerProcess
    router: support.RouterProcess

    def address(self, name: str) -> tuple[str, int]:
        return ("127.0.0.1", self.pod.port if name == "pod" else self.router.port)

    def headers(self, name: str) -> dict[str, str]:
        """What a legitimate client of the pod or of the router sends."""
        if name == "pod":
            return {protocol.POD_TOKEN_HEADER: support.POD_TOKEN}
        return {protocol.API_KEY_HEADER: API_KEY}

    def ws_url(self, name: str) -> str:
        return self.pod.ws_url if name == "pod" else self.router.ws_url

    def wait_settled(self, timeout: float = 30.0) -> None:
        """No slot used, no session of the router left in Redis, and no stream counted
        against the API key (a released session drops its key's count just after its
        record, in a call of its own: a test that reads the count at once may see it)."""
        self.pod.wait_idle(timeout)
        support.wait_until(lambda: not self.sessions(), timeout, "the sessions to be released")
        support.wait_until(lambda: not self.key_streams(), timeout,
                           "the API key's streams to be released")

    def sessions(self) -> list[str]:
        client = self.redis.client()
        try:
            return [k for k in client.scan_iter(keys.session("*", "*")) if not k.endswith(":ended")]
        finally:
            client.close()

    def key_streams(self) -> int:
        client = self.redis.client()
        try:
            return int(client.zcard(keys.key_sessions("hostile")))
        finally:
            client.close()


@contextlib.contextmanager
def running(workdir: Path, pod_flags: tuple[str, ...] = (),
            router_flags: tuple[str, ...] = ()) -> Iterator[Platform]:
    """Redis, the pod and the router (with these extra flags each)."""
    key_file = workdir / "keys.json"
    key_file.write_text(json.dumps(
        {"keys": [{"id": "hostile", "sha256": auth.hash_key(API_KEY), "max_streams": 8}]}))
    limits = ("--max-connections", str(MAX_CONNECTIONS))
    redis = redis_servers.RedisServer(workdir)
    redis.start()
    pod = support.pod(redis.url, workdir, "hostile", 2, "default",
                      "--send-timeout-seconds", str(SEND_TIMEOUT_S),
                      "--handshake-timeout-seconds", str(HANDSHAKE_TIMEOUT_S), *limits, *pod_flags)
    router = support.router(redis.url, workdir, "--api-keys-file", str(key_file),
                            "--send-timeout-seconds", str(SEND_TIMEOUT_S),
                            "--handshake-timeout-seconds", str(HANDSHAKE_TIMEOUT_S), *limits,
                            *router_flags)
    try:
        pod.start()
        pod.wait_ready()
        router.start()
        support.wait_until(lambda: support.pods_in_view(router, key=API_KEY) == 1, 20,
                           "the pod in the router's view")
        yield Platform(redis, pod, router)
    finally:
        router.kill()
        pod.stop()
        redis.stop()


@pytest.fixture(scope="package", params=["loop", "intake"])
def platform(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """The pod reading its streams' messages on its event loop, then in two intake
    processes: every attack is tried against both."""
    flags = ("--intake-workers", "2") if request.param == "intake" else ()
    with running(tmp_path_factory.mktemp("hostile-io"), pod_flags=flags) as started:
        yield started


@pytest.fixture(params=["pod", "router"])
def endpoint(request: pytest.FixtureRequest, platform: Platform) -> str:
    """Which side an attack goes to, once the previous test's streams have ended."""
    platform.wait_settled()
    return str(request.param)
