"""One way to make a Redis client: every call has a deadline, the password a Secret.

A Redis that stops answering must cost a bounded wait, never a hang: the operator holds
a pool's lock during a pass, a pod's heartbeat and a router's admission are on the hot
path. One retry covers a connection left stale by a Redis restart.

The password never travels in a URL, an argument or a ConfigMap: each part reads it
from ``ASRPOOL_REDIS_PASSWORD`` (set from a Secret by the chart and the operator) or
from the file named by ``ASRPOOL_REDIS_PASSWORD_FILE`` / ``--redis-password-file``.

A Redis Cluster is named by its URL's scheme, ``redis+cluster://HOST:PORT`` (or
``rediss+cluster://``, TLS), HOST:PORT being any one node: every part's ``--redis-url``
takes it, and gets redis-py's ``RedisCluster``, which sends each command and each
script to the node of its keys' slot. Every script the platform runs has its keys in
one slot (``registry.pool_tag``), so the cluster client answers the calls the platform
makes of a plain one (scripts, pipelines, single-key commands, ``TIME``), and
:func:`connect` gives it under the plain client's type. What differs: several calls in
one pipeline are sent node by node (:func:`is_cluster` tells the callers that run
scripts in pipelines), and keyless commands go to one node.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any, cast

import pydantic
import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.asyncio.retry as aioretry
import redis.cluster
from redis import backoff, driver_info, retry

from asrpool.common import environment

CLUSTER_SCHEME_SUFFIX = "+cluster"  # redis+cluster://, rediss+cluster://


class RedisPasswordError(ValueError):
    """The password cannot be read, or sits where it would leak; the message says which."""


class RedisCredentials(environment.Settings):
    """The settings fields every part shares for its Redis password."""

    # A secret, so never a flag (asrpool.common.settings_cli): the variable only.
    redis_password: pydantic.SecretStr | None = pydantic.Field(
        default=None, description="the Redis password (set from a Secret)")
    redis_password_file: Path | None = pydantic.Field(
        default=None, description="file holding the Redis password (or ASRPOOL_REDIS_PASSWORD)")

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> RedisCredentials:
        if self.redis_password is not None and self.redis_password_file is not None:
            raise ValueError("pass the Redis password as ASRPOOL_REDIS_PASSWORD or as"
                             " --redis-password-file, not both")
        return self

    def redis_password_value(self) -> str | None:
        """The password, read from its file at each call (a rotated Secret is picked up)."""
        if self.redis_password is not None:
            return self.redis_password.get_secret_value()
        if self.redis_password_file is None:
            return None
        try:
            text = self.redis_password_file.read_text()
        except OSError as exc:
            raise RedisPasswordError(
                f"cannot read the Redis password file {self.redis_password_file}: "
                f"{exc.strerror}") from exc
        return text.rstrip("\r\n")


def connect(url: str, timeout_seconds: float, *, password: str | None = None,
            decode_responses: bool = False) -> aioredis.Redis:
    """A client of the Redis (or, for a ``redis+cluster://`` URL, the Redis Cluster) at
    ``url``. A cluster client is given as the plain client's type: it answers every
    call the platform makes of one (see the module's docstring)."""
    # The asyncio client's own Retry: given the blocking client's, it retried nothing (it
    # called the command, got a coroutine back, no error, and the error came on await).
    options = {"password": password, "decode_responses": decode_responses,
               "retry": aioretry.Retry(backoff.NoBackoff(), 1), **_deadlines(timeout_seconds)}
    if is_cluster(url):
        return cast(aioredis.Redis, aiocluster.RedisCluster.from_url(plain_url(url), **options))
    return aioredis.Redis.from_url(url, **options)


def connect_sync(url: str, timeout_seconds: float, *, password: str | None = None,
                 decode_responses: bool = False) -> redis.Redis:
    """:func:`connect` for code without an event loop: the same deadlines and retry."""
    options = {"password": password, "decode_responses": decode_responses,
               "retry": retry.Retry(backoff.NoBackoff(), 1), **_deadlines(timeout_seconds)}
    if is_cluster(url):
        return cast(redis.Redis, redis.cluster.RedisCluster.from_url(plain_url(url), **options))
    return redis.Redis.from_url(url, **options)


def is_cluster(target: str | aioredis.Redis | redis.Redis) -> bool:
    """Whether a URL names a Redis Cluster, or a client is a cluster's."""
    if isinstance(target, str):
        return urllib.parse.urlsplit(target).scheme.endswith(CLUSTER_SCHEME_SUFFIX)
    return isinstance(target, aiocluster.RedisCluster | redis.cluster.RedisCluster)


def plain_url(url: str) -> str:
    """A ``redis+cluster://`` URL as redis-py's cluster client takes it (``redis://``)."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.removesuffix(CLUSTER_SCHEME_SUFFIX)
    return urllib.parse.urlunsplit(parts._replace(scheme=scheme))


def _deadlines(timeout_seconds: float) -> dict[str, Any]:
    """Every call and connect within the timeout (the caller's retry tries it once more
    on a dropped link)."""
    return {"socket_timeout": timeout_seconds, "socket_connect_timeout": timeout_seconds,
            # The version given, not looked up: redis-py would read its package metadata
            # from disk for every new connection (1-2 ms each, as admissions open them).
            "driver_info": driver_info.DriverInfo(lib_version=redis.__version__)}


def has_password(url: str) -> bool:
    """Whether a ``redis://`` URL carries a password (``redis://user:pw@host``)."""
    return urllib.parse.urlsplit(url).password is not None


def with_username(url: str, username: str) -> str:
    """The URL with ``username`` as its user (any user and password it had dropped)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{urllib.parse.quote(username)}@{host}"))


def without_password(url: str) -> str:
    """The URL as it may be logged or shown: any password replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
