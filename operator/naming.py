"""Names and labels of a pool's children: one place, so selectors always agree."""

from __future__ import annotations

from asrpool.common import protocol, registry

GROUP = "asrpool.io"
VERSION = "v1alpha1"
PLURAL = "streamingasrpools"
KIND = "StreamingASRPool"

POOL_LABEL = f"{GROUP}/pool"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
SERVER_APP = "asrpool-server"
MANAGER = "asrpool-operator"  # also the field manager of every server-side apply
APPLIED_ANNOTATION = f"{GROUP}/applied-digest"  # what the child was last built from

CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
SERVER_CONTAINER = "server"


def registry_name(namespace: str, pool_name: str) -> str:
    """The pool in the slot registry: ``namespace/name``, so that pools of one name in
    two namespaces never share pods (router.poolnames resolves clients' names)."""
    return registry.in_namespace(namespace, pool_name)


def streaming_url(router_url: str | None, registry: str) -> str | None:
    """Where a client streams to the pool through the routers at ``router_url``
    (``/pools/NAMESPACE/NAME/api/asr-streaming``; OpenAI's clients take ``/v1`` there
    instead of ``/api/asr-streaming``), or None when the operator was not told where the
    routers are."""
    if router_url is None:
        return None
    return f"{router_url}/pools/{registry}{protocol.STREAMING_PATH}"


def selector(pool_name: str) -> dict[str, str]:
    """The labels that pick a pool's server pods (immutable on a Deployment)."""
    return {NAME_LABEL: SERVER_APP, POOL_LABEL: pool_name}


def selector_text(pool_name: str) -> str:
    """``selector`` as a label-selector string (``status.selector``, list queries)."""
    return ",".join(f"{key}={value}" for key, value in sorted(selector(pool_name).items()))


def labels(pool_name: str) -> dict[str, str]:
    return {**selector(pool_name), INSTANCE_LABEL: pool_name, MANAGED_BY_LABEL: MANAGER}


def deployment(pool_name: str) -> str:
    return pool_name


def service(pool_name: str) -> str:
    return pool_name


def disruption_budget(pool_name: str) -> str:
    return pool_name


def config_map(pool_name: str) -> str:
    return f"{pool_name}-config"


def network_policy(pool_name: str) -> str:
    return pool_name


def pod_token_secret(pool_name: str) -> str:
    return f"{pool_name}-pod-token"


POD_TOKEN_KEY = "token"  # the key of the token in that Secret


def redis_secret(pool_name: str) -> str:
    """The Secret with the password of its namespace's Redis user (common.redis_acl)."""
    return f"{pool_name}-redis"


REDIS_PASSWORD_KEY = "password"  # the key of the password in that Secret


def pod_id(namespace: str, pod_name: str) -> str:
    """A server pod's id in the registry: NAMESPACE/NAME, unique across namespaces, and
    within the keys of its namespace's Redis user (common.redis_acl)."""
    return registry.in_namespace(namespace, pod_name)
