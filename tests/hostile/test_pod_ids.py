"""One pod id, one pod: a second process that registers an id a live pod holds is
refused at start, and a process's clean exit removes only its own record."""

from __future__ import annotations

import subprocess
import time
from typing import Any, cast

import pytest

from asrpool.common import registry
from tests.support import polling, redis_servers, servers

POD_ID = "pod-twin"


def _pod(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> servers.ServerProcess:
    return servers.ServerProcess(tmp_path_factory.mktemp("pod"), pod_id=POD_ID,
                                 args=["--redis-url", redis_url])


def _address(redis: Any) -> str | None:
    return cast("str | None", redis.hget(registry.pod_key("default", POD_ID), "address"))


async def test_a_second_process_with_a_live_pods_id_is_refused(
        tmp_path_factory: pytest.TempPathFactory,
        redis_server: redis_servers.RedisServer) -> None:
    redis = redis_server.client()
    with _pod(tmp_path_factory, redis_server.url) as first:
        first.wait_ready()
        await polling.until(lambda: _address(redis) == first.address)
        twin = _pod(tmp_path_factory, redis_server.url).start()
        try:
            code = twin.wait(timeout=60)
        except subprocess.TimeoutExpired:
            twin.stop()
            raise AssertionError("the twin kept running:\n" + twin.log()) from None
        assert code == 1
        assert f"pod id {POD_ID!r} is held by a live pod" in twin.log()
        time.sleep(1.0)  # the twin's exit removed nothing of the live pod's
        assert _address(redis) == first.address
        assert redis.zscore(registry.pool_pods_key("default"), POD_ID) is not None
        first.stop()
        assert first.poll() == 0
    assert not redis.exists(registry.pod_key("default", POD_ID))  # its own clean exit removes it


async def test_a_restart_after_a_crash_takes_the_id_once_its_lease_lapses(
        tmp_path_factory: pytest.TempPathFactory,
        redis_server: redis_servers.RedisServer) -> None:
    redis = redis_server.client()
    with _pod(tmp_path_factory, redis_server.url) as first:
        first.wait_ready()
        await polling.until(lambda: _address(redis) == first.address)
        first.process.kill()  # type: ignore[union-attr]
        first.wait(10)
    with _pod(tmp_path_factory, redis_server.url) as again:  # same id, at once
        again.wait_ready()
        await polling.until(lambda: _address(redis) == again.address)
