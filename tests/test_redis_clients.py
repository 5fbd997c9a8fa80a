"""The one Redis client factory: a Redis that stops answering costs a bounded wait."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest
import redis.exceptions

from asrpool.common import redis_clients
from tests.support import redis_servers


async def test_a_redis_that_stops_answering_fails_the_call_within_its_timeout(
    redis_server: redis_servers.RedisServer,
) -> None:
    client = redis_clients.connect(redis_server.url, 0.5)
    assert await client.ping()
    assert redis_server.process is not None
    redis_server.process.send_signal(signal.SIGSTOP)  # alive, accepting, answering nothing
    try:
        started = time.monotonic()
        with pytest.raises((redis.exceptions.TimeoutError, asyncio.TimeoutError)):
            await client.get("anything")
        assert time.monotonic() - started < 5.0  # two tries of 0.5 s, not forever
    finally:
        redis_server.process.send_signal(signal.SIGCONT)
    assert await client.ping()  # and it recovers by itself
    await client.aclose()


def test_the_client_without_an_event_loop_has_the_same_deadline(
    redis_server: redis_servers.RedisServer,
) -> None:
    client = redis_clients.connect_sync(redis_server.url, 0.5)
    assert client.ping()
    assert redis_server.process is not None
    redis_server.process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            client.get("anything")
        assert time.monotonic() - started < 5.0
    finally:
        redis_server.process.send_signal(signal.SIGCONT)
    assert client.ping()
    client.close()


async def test_a_redis_restart_fails_no_call(redis_server: redis_servers.RedisServer) -> None:
    """Each pooled connection is stale after a restart: its next call is tried again on
    a new one, not failed (a router's resume once answered "cannot reach its session
    registry" right after Redis came back)."""
    client = redis_clients.connect(redis_server.url, 5.0)
    await asyncio.gather(*(client.ping() for _ in range(4)))  # four pooled connections
    redis_server.kill()
    redis_server.start()
    assert await asyncio.gather(*(client.ping() for _ in range(4))) == [True] * 4
    await client.aclose()


def test_a_redis_restart_fails_no_call_without_an_event_loop(
    redis_server: redis_servers.RedisServer,
) -> None:
    client = redis_clients.connect_sync(redis_server.url, 5.0)
    assert client.ping()
    redis_server.kill()
    redis_server.start()
    assert client.ping()
    client.close()


@pytest.fixture
def locked_redis(tmp_path: Path) -> Iterator[redis_servers.RedisServer]:
    server = redis_servers.RedisServer(tmp_path, password="s3cret-Pass")
    server.start()
    yield server
    server.stop()


async def test_the_password_opens_a_locked_redis_and_its_absence_is_refused(
    locked_redis: redis_servers.RedisServer,
) -> None:
    client = redis_clients.connect(locked_redis.url, 0.5, password="s3cret-Pass")
    assert await client.ping()
    await client.aclose()
    anonymous = redis_clients.connect(locked_redis.url, 0.5)
    with pytest.raises(redis.exceptions.AuthenticationError):
        await anonymous.ping()
    await anonymous.aclose()


def test_the_client_without_an_event_loop_takes_the_password_and_decodes_when_asked(
    locked_redis: redis_servers.RedisServer,
) -> None:
    client = redis_clients.connect_sync(locked_redis.url, 0.5, password="s3cret-Pass",
                                        decode_responses=True)
    client.set("key", "value")
    assert client.get("key") == "value"
    client.close()
    anonymous = redis_clients.connect_sync(locked_redis.url, 0.5)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()
    anonymous.close()


def test_the_password_file_is_read_stripped_and_its_errors_say_which_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "password"
    path.write_text("from-a-secret\n")
    assert redis_clients.RedisCredentials(redis_password_file=path).redis_password_value() \
        == "from-a-secret"
    missing = redis_clients.RedisCredentials(redis_password_file=tmp_path / "none")
    with pytest.raises(redis_clients.RedisPasswordError, match="none: No such file"):
        missing.redis_password_value()
    with pytest.raises(pydantic.ValidationError, match="not both"):
        redis_clients.RedisCredentials(redis_password="x", redis_password_file=path)


def test_the_password_from_the_environment_is_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASRPOOL_REDIS_PASSWORD", "env-secret")
    credentials = redis_clients.RedisCredentials()
    assert credentials.redis_password_value() == "env-secret"
    assert "env-secret" not in repr(credentials)


def test_urls_with_a_password_are_recognised_and_masked() -> None:
    assert redis_clients.has_password("redis://:pw@host:6379/0")
    assert redis_clients.has_password("rediss://user:pw@host/2")
    assert not redis_clients.has_password("redis://host:6379/0")
    assert redis_clients.without_password("redis://user:pw@host:6379/0") == \
        "redis://user:***@host:6379/0"
    assert redis_clients.without_password("redis://host/0") == "redis://host/0"


def test_a_username_replaces_any_user_and_password_of_a_url() -> None:
    assert redis_clients.with_username("redis://host:6379/0", "asrpool-pods-a") == \
        "redis://asrpool-pods-a@host:6379/0"
    assert redis_clients.with_username("rediss://op:pw@host:6380/2", "asrpool-pods-a") == \
        "rediss://asrpool-pods-a@host:6380/2"


def test_a_cluster_is_named_by_its_urls_scheme() -> None:
    assert redis_clients.is_cluster("redis+cluster://10.0.0.1:7000/0")
    assert redis_clients.is_cluster("rediss+cluster://redis.example:7000")
    assert not redis_clients.is_cluster("redis://10.0.0.1:6379/0")
    assert not redis_clients.is_cluster("rediss://redis.example:6380/2")
    assert redis_clients.plain_url("rediss+cluster://u@h:7000/0") == "rediss://u@h:7000/0"
    assert redis_clients.with_username("redis+cluster://h:7000/0", "pods") == \
        "redis+cluster://pods@h:7000/0"
    assert redis_clients.without_password("redis+cluster://u:pw@h:7000/0") == \
        "redis+cluster://u:***@h:7000/0"


@pytest.mark.parametrize(("url", "sentinels", "service", "db", "user"), [
    ("redis+sentinel://a:26379,b:26380,c/asrpool/2", [("a", 26379), ("b", 26380),
                                                      ("c", 26379)], "asrpool", 2, None),
    ("redis+sentinel://ns-speech@[::1]:5000/main", [("::1", 5000)], "main", 0, "ns-speech"),
])
def test_a_sentinel_url_names_its_sentinels_service_and_database(
    url: str, sentinels: list[tuple[str, int]], service: str, db: int, user: str | None
) -> None:
    assert redis_clients.is_sentinel(url) and not redis_clients.is_cluster(url)
    where = redis_clients.sentinel_address(url)
    assert (where.sentinels, where.service, where.db, where.username) == (
        sentinels, service, db, user)


@pytest.mark.parametrize("url", ["redis+sentinel://a:1/", "redis+sentinel:///asrpool",
                                 "redis+sentinel://a:x/asrpool", "redis+sentinel://a/s/db"])
def test_a_sentinel_url_that_names_none_says_how_one_is_written(url: str) -> None:
    with pytest.raises(ValueError, match=r"redis\+sentinel://|is no number"):
        redis_clients.sentinel_address(url)
