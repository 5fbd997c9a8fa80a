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

A Redis run by Sentinel (high availability: a primary, its replicas, and sentinels that
promote a replica when the primary fails) is named by ``redis+sentinel://`` (or
``rediss+sentinel://``) with every sentinel, then the primary's service name and the
database: ``redis+sentinel://[USER@]S1:26379,S2:26379,S3:26379/SERVICE[/DB]``. The
client asks the sentinels for the primary, and again whenever a call finds it gone:
after a failover, the next call (the caller's one retry included) reaches the new one.
The sentinels are asked without a password; the password is the primary's.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from pathlib import Path
from typing import Any, cast

import pydantic
import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.asyncio.retry as aioretry
import redis.asyncio.sentinel as aiosentinel
import redis.cluster
import redis.sentinel
from redis import backoff, driver_info, retry

from asrpool.common import environment

CLUSTER_SCHEME_SUFFIX = "+cluster"  # redis+cluster://, rediss+cluster://
SENTINEL_SCHEME_SUFFIX = "+sentinel"  # redis+sentinel://, rediss+sentinel://
SENTINEL_PORT = 26379


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


# Every part's ``redis_url`` takes these forms (a pod's may be absent: no registry).
URL_FORMS = ("redis://host:port/db, or for a Redis Cluster redis+cluster://host:port naming"
             " any node, for Sentinel redis+sentinel://s1:26379,s2:26379/service/db; no"
             " password in it: ASRPOOL_REDIS_PASSWORD or --redis-password-file")


class RedisSettings(RedisCredentials):
    """Every command's Redis settings but its URL (whose default and meaning are each
    command's): the password, and how long one call may take."""

    redis_timeout_seconds: float = pydantic.Field(
        default=0.5, gt=0, description="longest wait for one Redis call")


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
    if is_sentinel(url):
        where = sentinel_address(url)
        sentinels = aiosentinel.Sentinel(  # type: ignore[no-untyped-call]
            where.sentinels, sentinel_kwargs=_deadlines(timeout_seconds))
        if where.tls:
            options["connection_class"] = aiosentinel.SentinelManagedSSLConnection
        primary = sentinels.master_for(where.service, redis_class=aioredis.Redis, db=where.db,
                                       username=where.username, **options)
        return cast(aioredis.Redis, primary)
    return aioredis.Redis.from_url(url, **options)


def connect_sync(url: str, timeout_seconds: float, *, password: str | None = None,
                 decode_responses: bool = False) -> redis.Redis:
    """:func:`connect` for code without an event loop: the same deadlines and retry."""
    options = {"password": password, "decode_responses": decode_responses,
               "retry": retry.Retry(backoff.NoBackoff(), 1), **_deadlines(timeout_seconds)}
    if is_cluster(url):
        return cast(redis.Redis, redis.cluster.RedisCluster.from_url(plain_url(url), **options))
    if is_sentinel(url):
        where = sentinel_address(url)
        sentinels = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            where.sentinels, sentinel_kwargs=_deadlines(timeout_seconds))
        if where.tls:
            options["connection_class"] = redis.sentinel.SentinelManagedSSLConnection
        primary = sentinels.master_for(  # type: ignore[no-untyped-call]
            where.service, redis_class=redis.Redis, db=where.db, username=where.username,
            **options)
        return cast(redis.Redis, primary)
    return redis.Redis.from_url(url, **options)


def is_cluster(target: str | aioredis.Redis | redis.Redis) -> bool:
    """Whether a URL names a Redis Cluster, or a client is a cluster's."""
    if isinstance(target, str):
        return urllib.parse.urlsplit(target).scheme.endswith(CLUSTER_SCHEME_SUFFIX)
    return isinstance(target, aiocluster.RedisCluster | redis.cluster.RedisCluster)


async def replicas(client: aioredis.Redis) -> list[aioredis.Redis]:
    """Clients of each replica the sentinels name now, for a client of a Redis run by
    Sentinel (none otherwise): what every data node must hold that is not replicated
    (ACL users), the caller closes them."""
    pool = getattr(client, "connection_pool", None)  # a cluster client has none
    if not isinstance(pool, aiosentinel.SentinelConnectionPool):
        return []
    found = await pool.sentinel_manager.discover_slaves(pool.service_name)
    kept = ("username", "password", "db", "socket_timeout", "socket_connect_timeout",
            "decode_responses", "driver_info")
    options = {key: value for key, value in pool.connection_kwargs.items() if key in kept}
    return [aioredis.Redis(host=str(host), port=int(port), **options) for host, port in found]


def is_sentinel(url: str) -> bool:
    """Whether a URL names a Redis run by Sentinel (``redis+sentinel://``)."""
    return urllib.parse.urlsplit(url).scheme.endswith(SENTINEL_SCHEME_SUFFIX)


@dataclasses.dataclass(frozen=True)
class SentinelAddress:
    sentinels: list[tuple[str, int]]
    service: str
    db: int
    username: str | None
    tls: bool


def sentinel_address(url: str) -> SentinelAddress:
    """The sentinels, service and database of a ``redis+sentinel://`` URL; ValueError
    saying what is wrong with one that names none."""
    parts = urllib.parse.urlsplit(url)
    user, _, hosts = parts.netloc.rpartition("@")
    sentinels = [_host_port(host, url) for host in hosts.split(",") if host]
    path = [part for part in parts.path.split("/") if part]
    if not sentinels or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"{without_password(url)}: a Sentinel URL is "
                         "redis+sentinel://[USER@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]")
    username = urllib.parse.unquote(user.partition(":")[0]) if user else None
    return SentinelAddress(sentinels, path[0], int(path[1]) if len(path) == 2 else 0,
                           username or None, parts.scheme.startswith("rediss"))


def _host_port(host: str, url: str) -> tuple[str, int]:
    """``HOST:PORT``, ``HOST`` (the sentinels' port) or ``[IPV6]:PORT``."""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        name, colon, port = host.rpartition(":")
        name, port = (name, port) if colon else (host, "")
    if port and not port.isdigit():
        raise ValueError(f"{without_password(url)}: sentinel port {port!r} is no number")
    return name, int(port) if port else SENTINEL_PORT


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
