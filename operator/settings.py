"""The operator's settings: flags of ``asrpool operator`` or ``ASRPOOL_*`` environment variables.

Each field's ``description`` is its ``--help`` (asrpool.common.settings_cli).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import pydantic
import pydantic_settings

from asrpool.common import logs, redis_clients

NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # RFC 1123 label
SERVER_PORT = 8080  # the port every server pod listens on (the pod contract)
DEFAULT_IMAGE = "ghcr.io/asrpool/asrpool:0.1.0"
# Router pods as the chart labels them, in any namespace.
DEFAULT_ROUTER_PEER: dict[str, Any] = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "asrpool",
                                    "app.kubernetes.io/component": "router"}},
}


class OperatorSettings(redis_clients.RedisSettings, logs.LogSettings):
    # Where the operator watches: the listed namespaces, or every namespace (both are
    # the command's own flags: -n/--namespace, repeatable, and -A/--all-namespaces).
    namespaces: Annotated[list[str], pydantic_settings.NoDecode] = pydantic.Field(
        default_factory=list, description="watch this namespace (repeatable; the variable:"
        " a,b)")
    all_namespaces: bool = pydantic.Field(default=False, description="watch every namespace")

    # Redis as the operator reads it (live slot use) and as server pods reach it.
    redis_url: str = pydantic.Field(
        default="redis://127.0.0.1:6379/0",
        description=f"Redis the pods heartbeat to ({redis_clients.URL_FORMS})")
    pod_redis_url: str | None = pydantic.Field(
        default=None, description="Redis URL as the server pods reach it, if not --redis-url"
        " (no password in it)")
    # The Secret (in each pool's namespace) whose key holds the Redis password: server
    # pods get it as ASRPOOL_REDIS_PASSWORD by reference, never as a literal.
    redis_password_secret: str | None = pydantic.Field(
        default=None, description="Secret in each pool's namespace holding the Redis password"
        " for the server pods (they get it by reference)")
    redis_password_secret_key: str = pydantic.Field(
        default="password", description="key of the password in that Secret")
    # A Redis user per pool namespace (asrpool.common.redis_acl), its password derived from
    # this seed (common.seeds) and written into a Secret in the pool's namespace for its
    # pods: they reach only their own namespace's keys. Needs a Redis with ACLs (6.2 or
    # later) and an operator user with ACL rights. A secret, so the variable only
    # (ASRPOOL_REDIS_PASSWORD_SEED). None: the pods share redis_password_secret, if any.
    redis_password_seed: pydantic.SecretStr | None = pydantic.Field(
        default=None, description="seed of each pool namespace's own Redis user's password")
    default_image: str = pydantic.Field(
        default=DEFAULT_IMAGE, description="server image for pools that name none")
    resync_seconds: float = pydantic.Field(
        default=15.0, gt=0, description="seconds between passes over each pool (drift, status,"
        " autoscaling)")
    termination_margin_seconds: int = pydantic.Field(
        default=15, ge=0, description="termination grace beyond a pool's drain grace period")

    kube_api_url: str | None = pydantic.Field(
        default=None, description="plain HTTP API endpoint such as `kubectl proxy`, no"
        " credentials sent (default: in-cluster credentials, then kubeconfig)")
    # The command's own flag: --liveness URL.
    liveness_endpoint: str | None = pydantic.Field(
        default=None, description="serve kopf's liveness probe, e.g."
        " http://0.0.0.0:8081/healthz")
    # A NetworkPolicy per pool: its server pods take connections on the server port
    # only from these peers (metrics share that port, so add the Prometheus pods here).
    network_policy: bool = pydantic.Field(
        default=True, description="make a NetworkPolicy per pool")
    # The command's own flag (JSON): --network-policy-from.
    network_policy_from: list[dict[str, Any]] = pydantic.Field(
        default_factory=lambda: [dict(DEFAULT_ROUTER_PEER)],
        description="the peers its server port admits, as NetworkPolicy 'from' entries in"
        " JSON (default: router pods of any namespace)")
    # Each pool's own pod token, derived from this seed as the routers derive it
    # (common.seeds), written into a Secret in the pool's namespace for its pods
    # (children.build_pod_token_secret). A secret, so the variable only (ASRPOOL_POD_TOKEN_SEED,
    # from the chart's Secret). None: pools' pods take the token their spec names, if any.
    pod_token_seed: pydantic.SecretStr | None = pydantic.Field(
        default=None, description="seed of each pool's own router-to-pod token")
    # Where the operator itself runs, and as whom (the chart sets both from the downward
    # API): a pool in that namespace may name neither the operator's service account nor
    # any Secret there (the Redis admin password, the seeds), which its pods would then
    # hold though the pool's writer may not read them (pools.check_release_namespace).
    release_namespace: str | None = pydantic.Field(
        default=None, description="the operator's own namespace: pools there may reference "
        "no Secret (unset: no such check)")
    service_account: str | None = pydantic.Field(
        default=None, description="the operator's own service account, which no pool in its "
        "namespace may run its pods as")
    # Several replicas: the name of the kopf peering object (a KopfPeering in each
    # watched namespace, a ClusterKopfPeering with all_namespaces). The replica of the
    # highest priority acts and the others wait; none (the default) runs standalone.
    peering: str | None = pydantic.Field(
        default=None, description="run as one of several replicas through the kopf peering"
        " object of this name: only the one of highest priority acts (default: standalone)")
    # None draws a random one at start, so no two replicas tie (kopf freezes every
    # replica of a tie).
    priority: int | None = pydantic.Field(
        default=None, ge=0, description="this replica's peering priority (default: a random"
        " one)")

    # Where clients reach the routers: each pool's status.url is its streaming URL there.
    router_url: str | None = pydantic.Field(
        default=None, pattern=r"^wss?://[^/?#]+$", description="the routers' address as "
        "clients reach them, ws[s]://HOST[:PORT] (each pool's status.url is its streaming "
        "URL there; default: no status.url)")

    @pydantic.field_validator("namespaces", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        """``ASRPOOL_NAMESPACES=a,b`` as well as a list."""
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @pydantic.field_validator("namespaces")
    @classmethod
    def _namespace_names(cls, names: list[str]) -> list[str]:
        """Names a Role can be bound in: a typo fails the start, not every watch call."""
        for name in names:
            if not NAMESPACE_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a namespace name (at most 63 lowercase"
                                 " letters, digits and '-', starting and ending alphanumeric)")
        return names

    @pydantic.model_validator(mode="after")
    def _one_scope(self) -> OperatorSettings:
        if self.all_namespaces and self.namespaces:
            raise ValueError("pass either namespaces or all_namespaces, not both")
        if not self.all_namespaces and not self.namespaces:
            raise ValueError("pass --namespace NAME (repeatable) or --all-namespaces")
        if redis_clients.has_password(self.server_redis_url):
            raise ValueError(
                "the Redis URL for server pods carries a password, which would be written"
                " into their Deployments; give the URL without it and name the Secret"
                " holding the password with --redis-password-secret")
        if self.redis_password_seed is not None and self.redis_password_secret:
            raise ValueError(
                "ASRPOOL_REDIS_PASSWORD_SEED gives each pool namespace its own Redis user and"
                " password, --redis-password-secret one password for every pod: not both")
        return self

    @property
    def server_redis_url(self) -> str:
        return self.pod_redis_url or self.redis_url

    @property
    def redis_url_shown(self) -> str:
        """The Redis URL for messages (status, events, logs): any password left out."""
        return redis_clients.without_password(self.redis_url)
