"""One real pod behind one real router, shared by the compatibility suite.

Every behaviour runs twice, against the pod directly and through the router
(``endpoint`` is parametrized), and asserts what moshi-server would answer. The pod's
resume grace is long (30 s) so that "freed at once" and "held for a resume" differ;
its idle and ping timers are short so that the idle behaviours run in seconds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.router import support
from tests.support import redis_servers, servers

BATCH = 2
GRACE_S = 30
IDLE_S = 6.0  # no audio this long: idle_timeout (moshi-server: 120 s)
PING_S, PONG_S = 1.0, 2.0  # no frame for PING_S + PONG_S: gone (moshi-server: 10 + 10 s)


@dataclasses.dataclass
class Platform:
    pod: servers.ServerProcess
    router: support.RouterProcess


@dataclasses.dataclass
class Endpoint:
    """Where a client connects (the pod itself, or the router), and the pod behind it."""

    name: str
    ws_url: str
    http_url: str
    pod: servers.ServerProcess
    headers: dict[str, str]  # what a direct client of this endpoint must send

    def used_slots(self) -> int:
        return int(self.pod.modules_info()["used_slots"])

    def get_json(self, path: str) -> Any:
        status, body = support.http_get(self.http_url + path)
        assert status == 200, body
        return json.loads(body)


@pytest.fixture(scope="package", params=["loop", "intake"])
def platform(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """The pod reading its streams' messages on its event loop, then in two intake
    processes: Kyutai's clients and every behaviour hold both ways."""
    workdir: Path = tmp_path_factory.mktemp("compat")
    redis = redis_servers.RedisServer(workdir)
    redis.start()
    intake = ("--intake-workers", "2") if request.param == "intake" else ()
    pod = support.pod(
        redis.url, workdir, "compat", BATCH, "default",
        "--resume-grace-seconds", str(GRACE_S), "--idle-timeout-seconds", str(IDLE_S),
        "--ping-interval-seconds", str(PING_S), "--ping-timeout-seconds", str(PONG_S),
        *intake,
    )
    router = support.router(
        redis.url, workdir, "--resume-grace-seconds", str(GRACE_S),
        "--ping-interval-seconds", str(PING_S), "--ping-timeout-seconds", str(PONG_S),
    )
    try:
        pod.start()
        pod.wait_ready()
        router.start()
        support.wait_until(lambda: support.pods_in_view(router) == 1, 20,
                           "the pod in the router's view")
        yield Platform(pod, router)
    finally:
        router.kill()
        pod.stop()
        redis.stop()


@pytest.fixture(params=["pod", "router"])
def endpoint(request: pytest.FixtureRequest, platform: Platform) -> Endpoint:
    """The pod or the router, once every slot of the previous test is free again."""
    platform.pod.wait_idle(40)
    if request.param == "pod":
        pod = platform.pod
        return Endpoint("pod", pod.ws_url, pod.http_url, pod,
                        {"asrpool-pod-token": support.POD_TOKEN})
    router = platform.router
    support.wait_until(lambda: settled(router), 20, "the router's sessions to end")
    return Endpoint("router", router.ws_url, router.url, platform.pod, {})


def settled(router: support.RouterProcess) -> bool:
    """Whether the router holds no session on the pool's pods (its Redis leases)."""
    status, body = support.http_get(router.url + "/api/pools")
    pods = json.loads(body)["pools"]["default"]["pods"] if status == 200 else []
    return all(p["router_sessions"] == 0 for p in pods)
