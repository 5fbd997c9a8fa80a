"""The server pod's settings: flags of ``asrpool serve`` or ``ASRPOOL_*`` environment variables."""

from __future__ import annotations

import socket
from pathlib import Path

import pydantic
import pydantic_settings

from asrpool.common import limits, protocol, redis_clients, registry

_WILDCARD_HOSTS = {"0.0.0.0", "::", ""}


class ServerSettings(redis_clients.RedisCredentials):
    model_config = pydantic_settings.SettingsConfigDict(env_prefix="ASRPOOL_", extra="ignore")

    # The model and its engine.
    model: str = "tiny"
    model_revision: str | None = None  # a Hugging Face revision (branch, tag or commit)
    batch_size: int = pydantic.Field(default=8, ge=1, le=4096)
    context: int | None = pydantic.Field(default=None, ge=1)
    device: str = "cpu"
    # "auto" is the one dtype policy (models.default_dtype): bfloat16 on CUDA, else float32.
    dtype: str = pydantic.Field(default="auto", pattern="^(auto|float32|bfloat16|float16)$")
    torch_threads: int | None = pydantic.Field(default=None, ge=1)  # CPU intra-op threads

    # Where it listens and how the platform finds it.
    host: str = "0.0.0.0"
    port: int = pydantic.Field(default=8080, ge=0, le=65535)
    redis_url: str | None = None  # no password in it: ASRPOOL_REDIS_PASSWORD(_FILE)
    redis_timeout_seconds: float = pydantic.Field(default=0.5, gt=0)
    pool: str = registry.DEFAULT_POOL
    pod_id: str = pydantic.Field(default_factory=socket.gethostname)
    advertise_address: str | None = None
    heartbeat_interval_seconds: float = pydantic.Field(default=0.5, gt=0)
    heartbeat_lease_ms: int = pydantic.Field(default=registry.DEFAULT_LEASE_MS, ge=100)

    # Who may connect.
    api_keys_file: Path | None = None
    pod_token: str | None = None

    # Per-stream limits and timers.
    max_buffer_seconds: float = pydantic.Field(default=10.0, gt=0)
    # As moshi-server: frames up to 16 MiB; a client is idle after 120 s without a
    # binary message, and dead after 20 s without any frame (a ping every 10 s that
    # is not answered within 10 s).
    max_message_bytes: int = pydantic.Field(default=protocol.DEFAULT_MAX_MESSAGE_BYTES, ge=1024)
    max_upload_bytes: int = pydantic.Field(default=64 << 20, ge=1024)  # POST bodies
    resume_grace_seconds: float = pydantic.Field(default=30.0, ge=0)
    max_pending_messages: int = pydantic.Field(default=10_000, ge=16)
    # One client cannot stall its neighbours (asrpool.server.budgets): messages per
    # second per connection (a frame's worth of audio is free), and markers waiting for
    # their audio per stream (one per 80 ms chunk with the buffer full is ~130).
    max_messages_per_second: float = pydantic.Field(default=250.0, gt=0)
    message_burst: float = pydantic.Field(default=2500.0, ge=1)
    max_pending_markers: int = pydantic.Field(default=256, ge=1)
    idle_timeout_seconds: float = pydantic.Field(default=120.0, gt=0)
    ping_interval_seconds: float = pydantic.Field(default=10.0, gt=0)
    ping_timeout_seconds: float = pydantic.Field(default=10.0, gt=0)
    drain_grace_seconds: float = pydantic.Field(default=30.0, ge=0)
    # What a connection may cost (asrpool.common.limits): a client whose unsent results
    # stay over the write buffer's high-water mark this long is dropped (too_slow).
    send_timeout_seconds: float = pydantic.Field(default=limits.DEFAULT_SEND_TIMEOUT_S, gt=0)
    max_head_bytes: int = pydantic.Field(default=limits.DEFAULT_MAX_HEAD_BYTES, ge=1024)
    max_headers: int = pydantic.Field(default=limits.DEFAULT_MAX_HEADERS, ge=8)
    max_url_bytes: int = pydantic.Field(default=limits.DEFAULT_MAX_URL_BYTES, ge=256)
    handshake_timeout_seconds: float = pydantic.Field(
        default=limits.DEFAULT_HANDSHAKE_TIMEOUT_S, gt=0)
    max_connections: int = pydantic.Field(default=2048, ge=2)  # keep above batch_size
    # New streams per second of this process (0: no limit), refused with HTTP 429 before
    # the upgrade: churn costs the event loop, and so the engine's steps (the GIL).
    new_streams_per_second: float = pydantic.Field(default=50.0, ge=0)
    new_streams_burst: float = pydantic.Field(default=100.0, ge=1)
    warmup_steps: int = pydantic.Field(default=2, ge=0)

    log_level: str = "info"

    @property
    def address(self) -> str:
        """What routers dial: the advertised address, or host:port (hostname if wildcard)."""
        if self.advertise_address:
            return self.advertise_address
        host = socket.gethostname() if self.host in _WILDCARD_HOSTS else self.host
        return f"{host}:{self.port}"

    @property
    def connection_limits(self) -> limits.Limits:
        return limits.Limits(
            max_head_bytes=self.max_head_bytes, max_headers=self.max_headers,
            max_url_bytes=self.max_url_bytes,
            handshake_timeout_seconds=self.handshake_timeout_seconds,
            max_connections=self.max_connections, send_timeout_seconds=self.send_timeout_seconds)

    @property
    def max_buffer_samples(self) -> int:
        return int(self.max_buffer_seconds * protocol.SAMPLE_RATE)
