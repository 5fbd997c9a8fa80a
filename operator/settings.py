"""The operator's settings: flags of ``asrpool operator`` or ``ASRPOOL_*`` environment variables."""

from __future__ import annotations

from typing import Annotated, Any

import pydantic
import pydantic_settings

from asrpool.common import redis_clients

SERVER_PORT = 8080  # the port every server pod listens on (the pod contract)
DEFAULT_IMAGE = "ghcr.io/asrpool/asrpool:0.1.0"


class OperatorSettings(redis_clients.RedisCredentials):
    model_config = pydantic_settings.SettingsConfigDict(env_prefix="ASRPOOL_", extra="ignore")

    # Where the operator watches: the listed namespaces, or every namespace.
    namespaces: Annotated[list[str], pydantic_settings.NoDecode] = pydantic.Field(
        default_factory=list)
    all_namespaces: bool = False

    # Redis as the operator reads it (live slot use) and as server pods reach it.
    redis_url: str = "redis://127.0.0.1:6379/0"
    pod_redis_url: str | None = None
    # The Secret (in each pool's namespace) whose key holds the Redis password: server
    # pods get it as ASRPOOL_REDIS_PASSWORD by reference, never as a literal.
    redis_password_secret: str | None = None
    redis_password_secret_key: str = "password"
    # Each Redis call waits at most this long: a Redis that stops answering never holds
    # a pool's pass (and its lock) for longer.
    redis_timeout_seconds: float = pydantic.Field(default=2.0, gt=0)

    default_image: str = DEFAULT_IMAGE
    # Seconds between two passes over each pool: drift repair, status, autoscaling.
    resync_seconds: float = pydantic.Field(default=15.0, gt=0)
    # Extra seconds of termination grace beyond a pool's drain grace period.
    termination_margin_seconds: int = pydantic.Field(default=15, ge=0)

    # The Kubernetes API: empty means in-cluster, then kubeconfig; a URL means a plain
    # HTTP endpoint such as `kubectl proxy` (no credentials are sent).
    kube_api_url: str | None = None
    liveness_endpoint: str | None = None  # e.g. http://0.0.0.0:8081/healthz
    log_level: str = "info"

    @pydantic.field_validator("namespaces", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        """``ASRPOOL_NAMESPACES=a,b`` as well as a list."""
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

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
        return self

    @property
    def server_redis_url(self) -> str:
        return self.pod_redis_url or self.redis_url
