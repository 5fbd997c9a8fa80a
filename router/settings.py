"""The router's settings: flags of ``asrpool route`` or ``ASRPOOL_*`` environment variables."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pydantic
import pydantic_settings

from asrpool.common import limits, protocol, redis_clients, registry
from asrpool.router import policies


def _router_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class RouterSettings(redis_clients.RedisCredentials):
    model_config = pydantic_settings.SettingsConfigDict(env_prefix="ASRPOOL_", extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    host: str = "0.0.0.0"
    port: int = pydantic.Field(default=8080, ge=0, le=65535)
    policy: policies.Policy = "pack"
    api_keys_file: Path | None = None
    queue_timeout_seconds: float = pydantic.Field(default=0.0, ge=0.0, le=300.0)
    # The wait queue (with queue_timeout_seconds > 0) of each pool holds this many waiters at
    # most, and this many of one API key (0: any number); a client beyond is refused
    # at once (queue_full, key_queue_full) rather than queued.
    queue_max: int = pydantic.Field(default=1000, ge=1)
    queue_max_per_key: int = pydantic.Field(default=100, ge=0)
    pod_token: str | None = None
    default_pool: str = registry.DEFAULT_POOL
    # Bare pool names mean this namespace's pools (router.poolnames); none: as written.
    pool_namespace: str | None = None
    router_id: str = pydantic.Field(default_factory=_router_id)
    # Router processes on one port (SO_REUSEPORT), sharing nothing but Redis; each
    # worker's router id is router_id-wN.
    workers: int = pydantic.Field(default_factory=_cpus, ge=1, le=256)

    # Leases: a router renews its sessions every session_lease_ms/3. A session counts
    # on its pod until session_lease_ms + resume_grace_seconds after its last renewal: a
    # crashed router's client may resume that long, and its pod holds the slot as long
    # (keep resume_grace_seconds at least the pods' --resume-grace-seconds).
    session_lease_ms: int = pydantic.Field(default=3000, ge=100)
    resume_grace_seconds: float = pydantic.Field(default=30.0, gt=0)
    # A pod's heartbeat missing this long ends its sessions (a pod that vanished
    # without closing its sockets); longer than the pods' lease (3 s) plus the time a
    # restarted Redis takes to be refilled by heartbeats.
    pod_gone_after_ms: int = pydantic.Field(default=5000, ge=0)
    queue_poll_seconds: float = pydantic.Field(default=0.1, gt=0)

    pod_connect_timeout_seconds: float = pydantic.Field(default=5.0, gt=0)
    pod_attempts: int = pydantic.Field(default=3, ge=1)
    # As moshi-server: frames up to 16 MiB; a client answering no ping (every 10 s)
    # within 10 s is gone (20 s without any frame).
    max_message_bytes: int = pydantic.Field(default=protocol.DEFAULT_MAX_MESSAGE_BYTES, ge=1024)
    max_upload_bytes: int = pydantic.Field(default=64 << 20, ge=1024)  # POST bodies
    ping_interval_seconds: float = pydantic.Field(default=10.0, gt=0)
    ping_timeout_seconds: float = pydantic.Field(default=10.0, gt=0)
    redis_timeout_seconds: float = pydantic.Field(default=0.5, gt=0)
    # What a connection may cost (asrpool.common.limits): a client whose unsent bytes
    # stay over the relay's high-water mark this long is dropped and its session released.
    send_timeout_seconds: float = pydantic.Field(default=limits.DEFAULT_SEND_TIMEOUT_S, gt=0)
    max_head_bytes: int = pydantic.Field(default=limits.DEFAULT_MAX_HEAD_BYTES, ge=1024)
    max_headers: int = pydantic.Field(default=limits.DEFAULT_MAX_HEADERS, ge=8)
    max_url_bytes: int = pydantic.Field(default=limits.DEFAULT_MAX_URL_BYTES, ge=256)
    handshake_timeout_seconds: float = pydantic.Field(
        default=limits.DEFAULT_HANDSHAKE_TIMEOUT_S, gt=0)
    max_connections: int = pydantic.Field(default=16384, ge=2)  # per worker process
    # New streams per second per client address, and per API key (0: no limit), per
    # worker process; over it HTTP 429 before the upgrade (router.throttling).
    new_streams_per_second: float = pydantic.Field(default=50.0, ge=0)
    new_streams_burst: float = pydantic.Field(default=100.0, ge=1)
    # What a pool costs, for /api/pools and the dashboard: dollars per GPU-hour (None:
    # no cost shown) and GPUs per server pod (the pools' resources.gpus).
    gpu_hour_price: float | None = pydantic.Field(default=None, ge=0)
    gpus_per_pod: float = pydantic.Field(default=1.0, ge=0)
    log_level: str = "info"

    @property
    def connection_limits(self) -> limits.Limits:
        return limits.Limits(
            max_head_bytes=self.max_head_bytes, max_headers=self.max_headers,
            max_url_bytes=self.max_url_bytes,
            handshake_timeout_seconds=self.handshake_timeout_seconds,
            max_connections=self.max_connections, send_timeout_seconds=self.send_timeout_seconds)

    @property
    def pending_ms(self) -> int:
        """How long a reservation counts before its pod accepts it (then, the hold): a
        router that dies while dialling a pod leaves the slot free again this soon."""
        dialling = self.session_lease_ms + int(2 * self.pod_connect_timeout_seconds * 1000)
        return min(dialling, self.hold_ms)

    @property
    def hold_ms(self) -> int:
        """How long a session counts (and its record lives) after its last renewal."""
        return self.session_lease_ms + int(self.resume_grace_seconds * 1000)
