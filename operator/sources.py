"""Where a pool's model comes from (``spec.model``), read and checked, and what each form
adds to the server pods: pure, like :mod:`asrpool.operator.children`.

Three forms. ``name`` is a preset (random weights), an absolute path in the image, or a
Hugging Face repo id; a repo is fetched once per cache by an init container running
``asrpool fetch-model`` (the server's own image), and the server loads it from there
offline. ``volume`` is a checkpoint directory on a PVC or a node's hostPath, mounted
read-only. The cache of a repo is the pod's emptyDir (``sizeLimit``, with a matching
``ephemeral-storage`` request, so the kubelet accounts for it instead of evicting the
pod for disk pressure), a node's hostPath (one download per node and namespace) or a
shared ReadWriteMany PVC (one download per pool).

The server mounts the cache read-only: only the init container writes it. A node's
cache is a folder per namespace (``/var/cache/asrpool/NAMESPACE`` unless the pool names
a path), so no tenant's pods mount another's weights; the kubelet creates it as root,
and a first init container, root with CAP_CHOWN alone, gives it to the server's user.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from asrpool.common import crd, weights
from asrpool.operator import specs

MODEL_DIR = "/var/lib/asrpool/model"  # a volume's checkpoint directory, in the server
CACHE_DIR = "/var/cache/asrpool"  # a repo's cache, in the init container and the server
HUB_CACHE = f"{CACHE_DIR}/hub"
FETCH_CONTAINER = "fetch-model"
MODEL_VOLUME = "model"
CACHE_VOLUME = "model-cache"
CACHE_KINDS = ("emptyDir", "hostPath", "persistentVolumeClaim")
DEFAULT_CACHE_SIZE = "20Gi"  # stt-2.6b-en is about 6 GB
NODE_CACHE_ROOT = "/var/cache/asrpool"  # a node's caches: one folder per namespace
OWNER_CONTAINER = "cache-owner"
STARTUP_PROBE_PERIOD = 5
Child = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Token:
    secret: str
    key: str


@dataclasses.dataclass(frozen=True)
class Volume:
    claim_name: str = ""
    host_path: str = ""
    sub_path: str = ""


@dataclasses.dataclass(frozen=True)
class Cache:
    kind: str
    size_limit: str
    path: str
    claim_name: str


@dataclasses.dataclass(frozen=True)
class ModelSource:
    name: str  # a preset, a repo id or a path in the image; "" for a volume
    revision: str
    token: Token | None
    volume: Volume | None
    cache: Cache
    load_timeout_seconds: int

    @property
    def kind(self) -> weights.Kind | None:
        return weights.kind_of(self.name) if self.volume is None else weights.Kind.PATH

    @property
    def fetched(self) -> bool:
        """A Hugging Face repo: an init container fetches it into the cache first."""
        return self.volume is None and self.kind is weights.Kind.REPO

    @property
    def reference(self) -> str:
        """What the server is told to load (``ASRPOOL_MODEL``)."""
        return MODEL_DIR if self.volume is not None else self.name


# Reading spec.model.

def read(model: specs.Section, namespace: str) -> ModelSource:
    """``spec.model`` of a pool in ``namespace``, read and checked;
    :class:`~asrpool.operator.specs.InvalidSpec` names what to fix."""
    has_name, has_volume = bool(model.get("name")), model.get("volume") is not None
    if has_name == has_volume:
        raise model.invalid("needs exactly one of name (a preset, a Hugging Face repo id or a"
                            " path in the image) and volume (a checkpoint directory)")
    source = ModelSource(
        name=model.text("name"), revision=model.text("revision"),
        token=_token(model.optional_section("tokenSecret", got=False)),
        volume=_volume(model.optional_section("volume", got=False)),
        cache=_cache(model.defaulted("cache", crd.at(crd.pool_spec(), "model"), got=False),
                     namespace),
        load_timeout_seconds=_seconds(model, "loadTimeoutSeconds"))
    _check(source, model)
    return source


def _check(source: ModelSource, model: specs.Section) -> None:
    if source.kind is None:
        raise model.error("name", f"{source.name!r} is none of {weights.describe_kinds()}")
    if not source.fetched:
        extras = [field for field in ("tokenSecret", "cache") if model.get(field) is not None]
        if extras:
            raise model.error(extras[0], "applies to a Hugging Face repo only;"
                                         f" {_described(source)} is not fetched")


def _described(source: ModelSource) -> str:
    if source.volume is not None:
        return "a volume"
    return f"{source.name!r} ({source.kind.value if source.kind else 'unknown'})"


def _token(ref: specs.Section | None) -> Token | None:
    if ref is None:
        return None
    return Token(ref.text("name", required=True), ref.text("key", required=True))


def _volume(ref: specs.Section | None) -> Volume | None:
    if ref is None:
        return None
    volume = Volume(ref.text("claimName"), ref.text("hostPath"), ref.text("subPath"))
    if bool(volume.claim_name) == bool(volume.host_path):
        raise ref.invalid("needs exactly one of claimName (a PVC) and hostPath (a folder on"
                          " each node)")
    if volume.host_path and not volume.host_path.startswith("/"):
        raise ref.error("hostPath", f"must be absolute, got {volume.host_path!r}")
    if volume.sub_path.startswith("/") or ".." in volume.sub_path.split("/"):
        raise ref.error("subPath", "must be relative, without '..'")
    return volume


def _cache(ref: specs.Section, namespace: str) -> Cache:
    cache = Cache(kind=ref.text("type", required=True),
                  size_limit=str(ref.get("sizeLimit") or DEFAULT_CACHE_SIZE),
                  path=ref.text("path") or f"{NODE_CACHE_ROOT}/{namespace}",
                  claim_name=ref.text("claimName"))
    if cache.kind not in CACHE_KINDS:
        raise ref.error("type", f"must be one of {', '.join(CACHE_KINDS)}, got {cache.kind!r}")
    if cache.kind == "persistentVolumeClaim" and not cache.claim_name:
        raise ref.error("claimName", "is required for a persistentVolumeClaim cache (a"
                                     " ReadWriteMany claim every pod of the pool mounts)")
    return cache


def _seconds(model: specs.Section, field: str) -> int:
    value = model.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise model.error(field, f"must be a positive integer, got {value!r}")
    return value


# What each form adds to the pods.

def server_environment(source: ModelSource) -> dict[str, str]:
    """The server's model settings (ConfigMap data; a change rolls the pods)."""
    env = {"ASRPOOL_MODEL": source.reference}
    if source.revision:
        env["ASRPOOL_MODEL_REVISION"] = source.revision
    if source.fetched:  # load what the init container fetched; never download at start
        env.update(HF_HUB_CACHE=HUB_CACHE, HF_HUB_OFFLINE="1")
    return env


def volumes(source: ModelSource) -> list[Child]:
    if source.volume is not None:
        if source.volume.claim_name:
            return [{"name": MODEL_VOLUME, "persistentVolumeClaim": {
                "claimName": source.volume.claim_name, "readOnly": True}}]
        return [{"name": MODEL_VOLUME, "hostPath": {"path": source.volume.host_path,
                                                   "type": "Directory"}}]
    if not source.fetched:
        return []
    cache = source.cache
    if cache.kind == "hostPath":
        return [{"name": CACHE_VOLUME, "hostPath": {"path": cache.path,
                                                   "type": "DirectoryOrCreate"}}]
    if cache.kind == "persistentVolumeClaim":
        return [{"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": cache.claim_name}}]
    return [{"name": CACHE_VOLUME, "emptyDir": {"sizeLimit": cache.size_limit}}]


def server_mounts(source: ModelSource) -> list[Child]:
    if source.volume is not None:
        mount: Child = {"name": MODEL_VOLUME, "mountPath": MODEL_DIR, "readOnly": True}
        if source.volume.sub_path:
            mount["subPath"] = source.volume.sub_path
        return [mount]
    if source.fetched:  # written by the init container alone
        return [{"name": CACHE_VOLUME, "mountPath": CACHE_DIR, "readOnly": True}]
    return []


def storage_requests(source: ModelSource) -> dict[str, str]:
    """An emptyDir cache counts against the pod's ephemeral storage: ask for it."""
    if source.fetched and source.cache.kind == "emptyDir":
        return {"ephemeral-storage": source.cache.size_limit}
    return {}


def fetch_container(source: ModelSource, image: str, pull_policy: str,
                    security: Child) -> Child | None:
    """The init container that puts a repo into the cache, or None when nothing is fetched."""
    if not source.fetched:
        return None
    args = [source.name, "--cache-dir", HUB_CACHE]
    if source.revision:
        args += ["--revision", source.revision]
    env: list[Child] = [{"name": "HF_HUB_DISABLE_PROGRESS_BARS", "value": "1"},
                        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
                        # A stalled connection fails (and restarts with back-off), never hangs.
                        {"name": "HF_HUB_DOWNLOAD_TIMEOUT", "value": "60"},
                        {"name": "HF_HUB_ETAG_TIMEOUT", "value": "20"}]
    if source.token is not None:  # from the Secret, into the environment: never in args
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": source.token.secret, "key": source.token.key}}})
    return {
        "name": FETCH_CONTAINER, "image": image, "imagePullPolicy": pull_policy,
        "command": ["asrpool", "fetch-model"], "args": args, "env": env,
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": CACHE_DIR}],
        # Its last line on stderr says what failed; the operator puts it in the status.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": security,
    }


def owner_container(source: ModelSource, image: str, pull_policy: str,
                    owner: int) -> Child | None:
    """For a node's cache: the folder the kubelet made (root's) given to ``owner``, the
    server's user, before the fetch writes in it. Root with CAP_CHOWN alone, the folder
    alone (not what is in it)."""
    if not source.fetched or source.cache.kind != "hostPath":
        return None
    return {
        "name": OWNER_CONTAINER, "image": image, "imagePullPolicy": pull_policy,
        "command": ["chown", f"{owner}:{owner}", CACHE_DIR],
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": CACHE_DIR}],
        "securityContext": {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}},
    }


def startup_failures(source: ModelSource) -> int:
    """Startup-probe misses allowed: the model-load budget in probe periods."""
    return max(1, math.ceil(source.load_timeout_seconds / STARTUP_PROBE_PERIOD))
