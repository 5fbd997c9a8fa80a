"""Pure builders: one pool to the plain dicts of its children.

Nothing here talks to Kubernetes; handlers adopt these dicts (owner references) and
apply them. Quantities and numbers that the API server renders as strings are built as
strings, so that a child read back compares equal to what was built.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from typing import Any

from asrpool.common import auth, redis_acl, redis_clients, seeds
from asrpool.operator import naming, pools, settings, sources, specs, templates

KEYS_DIR = pools.KEYS_DIR
Child = dict[str, Any]


def build_all(pool: pools.Pool, config: settings.OperatorSettings) -> list[Child]:
    """Every child of the pool, those its pods read first (ConfigMap, Secrets)."""
    pool = with_pod_token(pool, config)
    read = [build_config_map(pool, config),
            *([build_pod_token_secret(pool, config)] if owns_pod_token(pool, config) else []),
            *([build_redis_secret(pool, config)] if config.redis_password_seed else [])]
    return [
        *read,
        build_deployment(pool, config, config_hash(*read)),
        build_service(pool),
        build_disruption_budget(pool),
        *([build_network_policy(pool, config)] if config.network_policy else []),
    ]


def owns_pod_token(pool: pools.Pool, config: settings.OperatorSettings) -> bool:
    """Whether the pool's pod token is the operator's to write (from its seed)."""
    return config.pod_token_seed is not None and pool.pod_token == _own_token(pool)


def with_pod_token(pool: pools.Pool, config: settings.OperatorSettings) -> pools.Pool:
    """With a seed, every pool's pods take the token the routers derive for that pool
    (common.seeds), from a Secret the operator writes in the pool's namespace: no
    token is shared across namespaces, and no pool's pods take streams from anyone but
    the routers. A pool that names its own Secret then is invalid: the routers would
    never send that token."""
    if config.pod_token_seed is None:
        return pool
    if pool.pod_token is not None and pool.pod_token != _own_token(pool):
        raise specs.InvalidSpec(
            "spec.auth.podTokenSecret: this operator gives each pool its own pod token (its"
            f" Secret {_own_token(pool).name}), which is what the routers send; leave"
            " podTokenSecret out")
    return dataclasses.replace(pool, pod_token=_own_token(pool))


def _own_token(pool: pools.Pool) -> pools.SecretKey:
    return pools.SecretKey(naming.pod_token_secret(pool.name), naming.POD_TOKEN_KEY)


def build_pod_token_secret(pool: pools.Pool, config: settings.OperatorSettings) -> Child:
    """The pool's own pod token (:func:`with_pod_token`), for its pods' ASRPOOL_POD_TOKEN."""
    seed = auth.revealed(config.pod_token_seed)
    assert seed is not None, "only with a seed"
    token = seeds.pod_token(seed, pool.registry_name)
    return _secret(pool, naming.pod_token_secret(pool.name), naming.POD_TOKEN_KEY, token)


def _secret(pool: pools.Pool, name: str, key: str, value: str) -> Child:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(pool, name),
        "type": "Opaque",
        "data": {key: base64.b64encode(value.encode()).decode()},
    }


def redis_password(pool: pools.Pool, config: settings.OperatorSettings) -> str:
    """The password of the Redis user of the pool's namespace (common.redis_acl)."""
    seed = auth.revealed(config.redis_password_seed)
    assert seed is not None, "only with a seed"
    return seeds.redis_password(seed, pool.namespace)


def build_redis_secret(pool: pools.Pool, config: settings.OperatorSettings) -> Child:
    """The password of its namespace's Redis user, for the pods' ASRPOOL_REDIS_PASSWORD:
    the same in every pool of the namespace, and no other namespace's."""
    return _secret(pool, naming.redis_secret(pool.name), naming.REDIS_PASSWORD_KEY,
                   redis_password(pool, config))


def build_config_map(pool: pools.Pool, config: settings.OperatorSettings) -> Child:
    """The server's settings as ``ASRPOOL_*`` variables (each read by its own ``env``
    entry, :func:`_config_map_environment`)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(pool, naming.config_map(pool.name)),
        "data": server_environment(pool, config),
    }


def server_environment(pool: pools.Pool, config: settings.OperatorSettings) -> dict[str, str]:
    env = {
        **sources.server_environment(pool.source),
        "ASRPOOL_DTYPE": pool.dtype,
        # auto: measured by each pod; the template stays the same as they report
        "ASRPOOL_BATCH_SIZE": pools.AUTO if pool.auto_slots else str(pool.slots_per_pod),
        "ASRPOOL_CONTEXT": str(pool.context),
        "ASRPOOL_DEVICE": pool.device,
        "ASRPOOL_HOST": "0.0.0.0",
        "ASRPOOL_PORT": str(settings.SERVER_PORT),
        "ASRPOOL_POOL": pool.registry_name,
        "ASRPOOL_REDIS_URL": _pod_redis_url(pool, config),
        # Under Redis ACLs the pools set is out of the pods' reach: the operator adds the
        # pool as it publishes the members.
        "ASRPOOL_ANNOUNCE_POOL": "false" if config.redis_password_seed else "true",
        "ASRPOOL_DRAIN_GRACE_SECONDS": str(pool.drain_grace_seconds),
        "ASRPOOL_OPUS_WORKERS": str(pool.opus_workers),
        "ASRPOOL_INTAKE_WORKERS": str(pool.intake_workers),
        "ASRPOOL_ENGINE_PROCESS": "true" if pool.engine_process else "false",
    }
    if pool.api_keys is not None:
        env["ASRPOOL_API_KEYS_FILE"] = f"{KEYS_DIR}/{pool.api_keys.key}"
    return env


def _pod_redis_url(pool: pools.Pool, config: settings.OperatorSettings) -> str:
    if config.redis_password_seed is None:
        return config.server_redis_url
    return redis_clients.with_username(config.server_redis_url,
                                       redis_acl.pod_user(pool.namespace))


def config_hash(*read: Child) -> str:
    """A digest of the data the pods read (the ConfigMap, the pod token's and the Redis
    password's Secrets): in the pod template, so a change rolls the pods."""
    text = json.dumps([child["data"] for child in read], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_deployment(pool: pools.Pool, config: settings.OperatorSettings, digest: str) -> Child:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(pool, naming.deployment(pool.name)),
        "spec": {
            "replicas": pool.pods,
            "selector": {"matchLabels": naming.selector(pool.name)},
            # By default one new pod before an old one goes: a roll never lowers the slots
            # on offer, and each old pod drains its streams on SIGTERM.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": pool.rollout.max_surge,
                                  "maxUnavailable": pool.rollout.max_unavailable},
            },
            "revisionHistoryLimit": 3,
            "template": build_pod_template(pool, config, digest),
        },
    }


SERVER_USER = 10001  # the server image's user (docker/server.Dockerfile)


def pod_security() -> Child:
    """The "restricted" Pod Security Standard, pod part."""
    return {"runAsNonRoot": True, "runAsUser": SERVER_USER, "runAsGroup": SERVER_USER,
            "fsGroup": SERVER_USER, "seccompProfile": {"type": "RuntimeDefault"}}


def container_security() -> Child:
    """Read-only root: what the server writes goes to the emptyDirs of
    :func:`writable_volumes` (scratch space and the downloaded model)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True}


# (volume name, mount path): the only paths a server pod writes. HF_HOME is /models in
# the image (the model downloads there at start); /tmp for Python's and torch's scratch.
WRITABLE_PATHS = (("tmp", "/tmp"), ("models", "/models"))


def writable_volumes() -> list[Child]:
    return [{"name": name, "emptyDir": {}} for name, _ in WRITABLE_PATHS]


def writable_mounts() -> list[Child]:
    return [{"name": name, "mountPath": path} for name, path in WRITABLE_PATHS]


def build_pod_template(pool: pools.Pool, config: settings.OperatorSettings, digest: str) -> Child:
    spec: Child = {
        "terminationGracePeriodSeconds": termination_grace(pool, config),
        "containers": [build_container(pool, config)],
        "enableServiceLinks": False,
        "securityContext": pod_security(),
        **templates.pod_fields(pool.template),
    }
    spec.update(_placement(pool))
    image = pool.image or config.default_image
    first = [sources.owner_container(pool.source, image, pool.image_pull_policy, SERVER_USER),
             build_fetch_container(pool, config)]
    if any(first):
        spec["initContainers"] = [container for container in first if container is not None]
    spec["volumes"] = [*writable_volumes(), *_volumes(pool)]
    return {
        "metadata": templates.metadata(pool.template, naming.labels(pool.name),
                                       {naming.CONFIG_HASH_ANNOTATION: digest}),
        "spec": spec,
    }


def build_fetch_container(pool: pools.Pool, config: settings.OperatorSettings) -> Child | None:
    """``asrpool fetch-model`` into the cache, before the server starts (repos only)."""
    fetch = sources.fetch_container(pool.source, pool.image or config.default_image,
                                    pool.image_pull_policy, container_security())
    if fetch is None:
        return None
    fetch["volumeMounts"] = [*writable_mounts(), *fetch.get("volumeMounts", [])]  # read-only root
    return templates.add_to_container(fetch, pool.template)


def _volumes(pool: pools.Pool) -> list[Child]:
    """The operator's volumes (API keys, the model or its cache), then the pool's own."""
    own = [_keys_volume(pool.api_keys)] if pool.api_keys is not None else []
    return [*own, *sources.volumes(pool.source), *map(dict, pool.template.volumes)]


def termination_grace(pool: pools.Pool, config: settings.OperatorSettings) -> int:
    """Drain grace plus a margin: the kubelet's SIGKILL never lands before the drain ends."""
    return pool.drain_grace_seconds + config.termination_margin_seconds


def build_container(pool: pools.Pool, config: settings.OperatorSettings) -> Child:
    container: Child = {
        "name": naming.SERVER_CONTAINER,
        "image": pool.image or config.default_image,
        "imagePullPolicy": pool.image_pull_policy,
        "command": ["asrpool", "serve"],
        "env": [*_config_map_environment(pool, config), *_pod_environment(pool, config)],
        "ports": [{"name": "http", "containerPort": settings.SERVER_PORT, "protocol": "TCP"}],
        # 200 once the model is loaded and warmed, within spec.model.loadTimeoutSeconds.
        "startupProbe": _probe("/startupz", period=sources.STARTUP_PROBE_PERIOD,
                               failures=sources.startup_failures(pool.source)),
        "livenessProbe": _probe("/healthz", period=10, failures=3),
        # Three misses before unready: the ReplicaSet controller deletes unready pods
        # before any other on scale-down, so a busy pod slow to answer once must stay ready.
        "readinessProbe": _probe("/readyz", period=2, failures=3),
        "resources": build_resources(pool),
        # A server that cannot load its model says why in its last line; the pool shows it.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security(),
    }
    mounts = writable_mounts()
    if pool.api_keys is not None:
        mounts.append({"name": pools.KEYS_VOLUME, "mountPath": KEYS_DIR, "readOnly": True})
    container["volumeMounts"] = [*mounts, *sources.server_mounts(pool.source)]
    return templates.add_to_container(container, pool.template)


def _config_map_environment(pool: pools.Pool,
                            config: settings.OperatorSettings) -> list[Child]:
    """The ConfigMap's variables one by one in ``env``, which wins over any ``envFrom``:
    a pool's own ``spec.envFrom`` (listed after the operator's, as the Kubernetes API
    takes the last) used to replace them, ``ASRPOOL_POOL`` and ``ASRPOOL_REDIS_URL``
    included."""
    name = naming.config_map(pool.name)
    return [{"name": key, "valueFrom": {"configMapKeyRef": {"name": name, "key": key}}}
            for key in server_environment(pool, config)]


def _pod_environment(pool: pools.Pool, config: settings.OperatorSettings) -> list[Child]:
    env: list[Child] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAMESPACE",
         "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "ASRPOOL_POD_ID", "value": naming.pod_id("$(POD_NAMESPACE)", "$(POD_NAME)")},
        {"name": "ASRPOOL_ADVERTISE_ADDRESS", "value": f"$(POD_IP):{settings.SERVER_PORT}"},
    ]
    if pool.pod_token is not None:
        ref = {"name": pool.pod_token.name, "key": pool.pod_token.key}
        env.append({"name": "ASRPOOL_POD_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    if config.redis_password_seed is not None:
        ref = {"name": naming.redis_secret(pool.name), "key": naming.REDIS_PASSWORD_KEY}
        env.append({"name": "ASRPOOL_REDIS_PASSWORD", "valueFrom": {"secretKeyRef": ref}})
    elif config.redis_password_secret:
        ref = {"name": config.redis_password_secret, "key": config.redis_password_secret_key}
        env.append({"name": "ASRPOOL_REDIS_PASSWORD", "valueFrom": {"secretKeyRef": ref}})
    return env


def _probe(path: str, *, period: int, failures: int) -> Child:
    return {
        "httpGet": {"path": path, "port": "http", "scheme": "HTTP"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 2,
    }


def build_resources(pool: pools.Pool) -> Child:
    """GPUs as both request and limit (extended resources must match); CPU/memory if set."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if pool.gpus > 0:
        requests[pool.gpu_resource] = limits[pool.gpu_resource] = str(pool.gpus)
    if pool.cpu:
        requests["cpu"] = pool.cpu
    if pool.memory:
        requests["memory"] = limits["memory"] = pool.memory
    requests.update(sources.storage_requests(pool.source))
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


def _placement(pool: pools.Pool) -> Child:
    placement: Child = {}
    if pool.node_selector:
        placement["nodeSelector"] = dict(pool.node_selector)
    if pool.tolerations:
        placement["tolerations"] = [dict(item) for item in pool.tolerations]
    if pool.affinity:
        placement["affinity"] = dict(pool.affinity)
    if pool.priority_class:
        placement["priorityClassName"] = pool.priority_class
    return placement


def _keys_volume(secret: pools.SecretKey) -> Child:
    return {"name": pools.KEYS_VOLUME, "secret": {"secretName": secret.name}}


def build_service(pool: pools.Pool) -> Child:
    """Headless: the router reaches pods by their advertised address; this is for
    discovery and metrics scraping."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pool, naming.service(pool.name)),
        "spec": {
            "clusterIP": "None",
            "selector": naming.selector(pool.name),
            "ports": [{"name": "http", "port": settings.SERVER_PORT, "targetPort": "http",
                       "protocol": "TCP"}],
        },
    }


def build_disruption_budget(pool: pools.Pool) -> Child:
    """Voluntary evictions (node drains) take one pod at a time by default; each drains
    its streams."""
    budget = pool.disruption_budget
    limit = ({"maxUnavailable": budget.max_unavailable} if budget.min_available is None
             else {"minAvailable": budget.min_available})
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(pool, naming.disruption_budget(pool.name)),
        "spec": {**limit, "selector": {"matchLabels": naming.selector(pool.name)}},
    }


def build_network_policy(pool: pools.Pool, config: settings.OperatorSettings) -> Child:
    """Only the configured peers (routers, by default) reach the server port; nothing
    else in the cluster can open a stream on a pod directly. Metrics share that port."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(pool, naming.network_policy(pool.name)),
        "spec": {
            "podSelector": {"matchLabels": naming.selector(pool.name)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [dict(peer) for peer in config.network_policy_from],
                         "ports": [{"port": settings.SERVER_PORT, "protocol": "TCP"}]}],
        },
    }


def _metadata(pool: pools.Pool, name: str) -> Child:
    return {"name": name, "namespace": pool.namespace, "labels": naming.labels(pool.name)}
