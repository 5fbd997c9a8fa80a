"""The router's settings: flags of ``asrpool route`` or ``ASRPOOL_*`` environment variables.

Each field's ``description`` is its ``--help`` (asrpool.common.settings_cli).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pydantic

from asrpool.common import auth, limits, logs, redis_clients, registry, seeds
from asrpool.router import forwarding, policies


def _router_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class RouterSettings(redis_clients.RedisSettings, logs.LogSettings, limits.LimitSettings,
                     limits.StreamSettings):
    redis_url: str = pydantic.Field(
        default="redis://127.0.0.1:6379/0",
        description=f"Redis of the slot registry ({redis_clients.URL_FORMS})")
    host: str = pydantic.Field(default="0.0.0.0", description="address to listen on")
    port: int = pydantic.Field(default=8080, ge=0, le=65535, description="port to listen on")
    # The public port then serves what clients use alone (streams, uploads, the live
    # page, /api/pools): the metrics and the router's internals stay off an Ingress.
    admin_port: int | None = pydantic.Field(
        default=None, ge=1, le=65535, description="serve /metrics, /api/build_info, "
        "/api/modules_info and the probes on this port alone, not on --port (default: "
        "everything on --port)")
    policy: policies.Policy = pydantic.Field(
        default="pack", description="pack: busiest pod with room; spread: emptiest pod")
    api_keys_file: Path | None = pydantic.Field(
        default=None, description="YAML/JSON file of hashed API keys (none: no auth)")
    queue_timeout_seconds: float = pydantic.Field(
        default=0.0, ge=0.0, le=300.0,
        description="seconds to wait for a free slot (0: refuse at once)")
    # The wait queue (with queue_timeout_seconds > 0) of each pool holds this many waiters at
    # most, and this many of one API key (0: any number); a client beyond is refused
    # at once (queue_full, key_queue_full) rather than queued.
    queue_max: int = pydantic.Field(
        default=1000, ge=1, description="waiters one pool's queue holds at most")
    queue_max_per_key: int = pydantic.Field(
        default=100, ge=0, description="waiters of one API key in a pool's queue at most (0: any)")
    # A secret, so never a flag (ps shows every process's arguments): the variable only,
    # which the chart sets from its Secret.
    pod_token: pydantic.SecretStr | None = pydantic.Field(
        default=None, description="shared secret sent to pods in the asrpool-pod-token header")
    # Or each pool its own token, derived from this seed (common.seeds), which the
    # operator gives that pool's pods (the chart's way): not both.
    pod_token_seed: pydantic.SecretStr | None = pydantic.Field(
        default=None, description="seed of each pool's own pod token (instead of pod_token)")
    default_pool: str = pydantic.Field(
        default=registry.DEFAULT_POOL, description="pool for clients that name none")
    # Bare pool names mean this namespace's pools (router.poolnames); none: as written.
    pool_namespace: str | None = pydantic.Field(
        default=None, description="namespace of pools named without one (NAME ="
        " NAMESPACE/NAME; none: as written)")
    router_id: str = pydantic.Field(
        default_factory=_router_id,
        description="this replica's name in session records (default: host-pid)")
    # Router processes on one port (SO_REUSEPORT), sharing nothing but Redis; each
    # worker's router id is router_id-wN.
    workers: int = pydantic.Field(
        default_factory=_cpus, ge=1, le=256,
        description="router processes on the port, sharing only Redis (default: the CPUs)")

    # Leases: a router renews its sessions every session_lease_ms/3. A session counts
    # on its pod until session_lease_ms + resume_grace_seconds after its last renewal: a
    # crashed router's client may resume that long, and its pod holds the slot as long
    # (keep resume_grace_seconds at least the pods' --resume-grace-seconds).
    session_lease_ms: int = pydantic.Field(
        default=3000, ge=100, description="lease of a session record, renewed every third")
    # SIGTERM (router.draining): readiness 503 and new streams refused at once; open
    # streams relay on for this long, then each is told the drain Error and closed 1012
    # (resumable on another router with its token).
    drain_grace_seconds: float = pydantic.Field(
        default=30.0, ge=0,
        description="SIGTERM: open streams relay on for this long, then end (resumable)")
    # Whoever can write Redis can write a heartbeat: with this on (the default), a pool
    # is open only once the operator (or the local platform) has listed its real pods,
    # and only to them; off, a pool that has no list yet admits to any heartbeat (a bare
    # pod and router, by hand, on a Redis no one else writes).
    members_required: bool = pydantic.Field(
        default=True, description="admit only to pods the operator (or the local platform)"
        " listed; a pool with no list yet waits for it (busy); off: any heartbeat of a pool"
        " with no list")
    # A pod's heartbeat missing this long ends its sessions (a pod that vanished
    # without closing its sockets); longer than the pods' lease (3 s) plus the time a
    # restarted Redis takes to be refilled by heartbeats.
    pod_gone_after_ms: int = pydantic.Field(
        default=5000, ge=0,
        description="a pod whose heartbeat is missing this long loses its sessions")
    queue_poll_seconds: float = pydantic.Field(
        default=0.1, gt=0, description="how often a waiting client's admission is retried")

    pod_connect_timeout_seconds: float = pydantic.Field(
        default=5.0, gt=0, description="longest wait to connect to a pod")
    pod_attempts: int = pydantic.Field(
        default=3, ge=1, description="pods tried for one stream before it is refused")
    # Message sizes and client liveness: limits.StreamSettings.
    # What a connection may cost: limits.LimitSettings (the relay applies the send
    # deadline too, and releases the session).
    max_connections: limits.MaxConnections = 16384
    # New streams per second per client address, and per API key (0: no limit), per
    # router (each worker process enforces its share); over it HTTP 429 before the
    # upgrade (router.throttling).
    new_streams_per_second: float = pydantic.Field(
        default=50.0, ge=0, description="new streams per second of one client address and of"
        " one API key, per router (each worker enforces its share; else HTTP 429; 0: any"
        " number)")
    new_streams_burst: float = pydantic.Field(
        default=100.0, ge=1, description="new streams one client may save up, per router")
    # Behind a load balancer or an ingress every client has its address: name them, and
    # the limit per address follows their X-Forwarded-For (router.forwarding).
    forwarded_allow_ips: str = pydantic.Field(
        default="", description="proxies in front of the router whose X-Forwarded-For names"
        " the client, for the limit per address: comma-separated addresses or networks, or *")

    @pydantic.field_validator("forwarded_allow_ips")
    @classmethod
    def _proxies_parse(cls, value: str) -> str:
        forwarding.TrustedProxies(value)  # a ValueError names the bad entry
        return value
    # What a pool costs, for /api/pools and the dashboard: dollars per GPU-hour (None:
    # no cost shown) and GPUs per server pod (the pools' resources.gpus).
    gpu_hour_price: float | None = pydantic.Field(
        default=None, ge=0, description="dollars per GPU-hour: /api/pools and /metrics show"
        " the cost")
    gpus_per_pod: float = pydantic.Field(default=1.0, ge=0, description="GPUs of one server pod")

    def asks_no_key(self) -> bool:
        """No API key file: anyone who reaches the router may stream."""
        return self.api_keys_file is None

    @pydantic.model_validator(mode="after")
    def _admin_port_of_its_own(self) -> RouterSettings:
        if self.admin_port is not None and self.admin_port == self.port:
            raise ValueError(f"--admin-port {self.admin_port} is --port too: give it a port "
                             "of its own")
        return self

    @pydantic.model_validator(mode="after")
    def _one_kind_of_pod_token(self) -> RouterSettings:
        if self.pod_token is not None and self.pod_token_seed is not None:
            raise ValueError("ASRPOOL_POD_TOKEN and ASRPOOL_POD_TOKEN_SEED are both set: one"
                             " token for every pool, or a token per pool from the seed, not both")
        return self

    def pod_token_for(self, pool: str) -> str | None:
        """The token this router sends to the pods of ``pool`` (none: no header)."""
        seed = auth.revealed(self.pod_token_seed)
        if seed is not None:
            return seeds.pod_token(seed, pool)
        return auth.revealed(self.pod_token)

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
