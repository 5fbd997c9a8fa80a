"""A ``StreamingASRPool`` read into a typed, checked value.

The CRD's schema rejects most bad input at the API server. What it cannot see (a pool
that needs more GPUs than it may use, autoscaling bounds out of order, a name too long
for its children) is checked here, and :class:`InvalidPool` says what to fix. Defaults
mirror the CRD's own (a test holds them equal), because an API server that skips
defaulting, or an older CRD, must not change what the operator builds.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from asrpool.common import dtypes
from asrpool.operator import naming, sources, templates

MAX_NAME_LENGTH = 50  # children are named after the pool; label values stop at 63
DEFAULT_SLOTS_PER_POD = 8
DEFAULT_CONTEXT = 375  # model steps of 80 ms: 30 s of rolling context
DEFAULT_DRAIN_GRACE_SECONDS = 60
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_PULL_POLICY = "IfNotPresent"
DEFAULT_DTYPE = dtypes.AUTO  # the server's policy: bfloat16 on CUDA, float32 on the CPU


class InvalidPool(ValueError):
    """The pool cannot be built as written; the message names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class ScalingPolicy:
    """One rate limit, as an HPA's ``behavior`` policy: ``Pods`` counts server pods."""

    type: str  # Pods | Percent
    value: int
    period_seconds: float


@dataclasses.dataclass(frozen=True)
class ScalingRules:
    select: str = "Max"  # Max | Min | Disabled
    policies: tuple[ScalingPolicy, ...] = ()


# The HPA's defaults (autoscaling/v2): up by 4 pods or 100% per 15 s, whichever is
# more; down by up to 100% per 15 s (the stabilisation window does the waiting).
DEFAULT_SCALE_UP = ScalingRules("Max", (ScalingPolicy("Pods", 4, 15.0),
                                        ScalingPolicy("Percent", 100, 15.0)))
DEFAULT_SCALE_DOWN = ScalingRules("Max", (ScalingPolicy("Percent", 100, 15.0),))


@dataclasses.dataclass(frozen=True)
class Behavior:
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN


@dataclasses.dataclass(frozen=True)
class Autoscaling:
    enabled: bool = False
    min_slots: int = 0  # from_body defaults it to one pod's slots
    max_slots: int = 0
    target_free_fraction: float = 0.25
    scale_up_seconds: float = 0.0
    scale_down_seconds: float = 300.0
    behavior: Behavior = Behavior()


IntOrPercent = int | str  # 1 or "25%", as the Deployment and PDB APIs take them


@dataclasses.dataclass(frozen=True)
class Rollout:
    """The Deployment's RollingUpdate. One new pod before an old one goes (the default):
    a roll never lowers the slots on offer, but each surge pod needs a spare GPU."""

    max_surge: IntOrPercent = 1
    max_unavailable: IntOrPercent = 0


@dataclasses.dataclass(frozen=True)
class DisruptionBudget:
    """The PodDisruptionBudget: exactly one of the two; by default one pod at a time."""

    max_unavailable: IntOrPercent | None = 1
    min_available: IntOrPercent | None = None


@dataclasses.dataclass(frozen=True)
class SecretKey:
    name: str
    key: str


@dataclasses.dataclass(frozen=True)
class Pool:
    """What the operator needs of one pool, defaults applied."""

    name: str
    namespace: str
    model: str
    slots: int
    revision: str = ""
    slots_per_pod: int = DEFAULT_SLOTS_PER_POD
    context: int = DEFAULT_CONTEXT
    image: str = ""
    image_pull_policy: str = DEFAULT_PULL_POLICY
    gpus: int = 1
    gpu_resource: str = DEFAULT_GPU_RESOURCE
    cpu: str = ""
    memory: str = ""
    max_gpus: int | None = None
    drain_grace_seconds: int = DEFAULT_DRAIN_GRACE_SECONDS
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    priority_class: str = ""
    autoscaling: Autoscaling = Autoscaling()
    api_keys: SecretKey | None = None
    pod_token: SecretKey | None = None
    source: sources.ModelSource = dataclasses.field(  # spec.model, read
        default_factory=lambda: sources.ModelSource(name="tiny"))
    dtype: str = DEFAULT_DTYPE
    template: templates.PodTemplate = dataclasses.field(  # pod template pass-through
        default_factory=templates.PodTemplate)
    rollout: Rollout = Rollout()
    disruption_budget: DisruptionBudget = DisruptionBudget()

    @property
    def pods(self) -> int:
        """Server pods needed for ``slots`` stream slots: ceil(slots / slotsPerPod)."""
        return pods_for(self.slots, self.slots_per_pod)

    @property
    def registry_name(self) -> str:
        """The pool in the slot registry (naming.registry_name)."""
        return naming.registry_name(self.namespace, self.name)

    @property
    def device(self) -> str:
        return "cuda" if self.gpus > 0 else "cpu"


def pods_for(slots: int, slots_per_pod: int) -> int:
    return math.ceil(slots / slots_per_pod)


def from_body(body: Mapping[str, Any]) -> Pool:
    """Read and check a pool object (``metadata`` and ``spec``); raise :class:`InvalidPool`."""
    meta, spec = body.get("metadata", {}), body.get("spec") or {}
    source, template = _model(spec), _template(spec)
    pool = Pool(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace") or "default"),
        model=source.reference,
        revision=source.revision,
        source=source,
        dtype=_dtype(spec),
        template=template,
        slots=_integer(spec, "slots", required=True),
        slots_per_pod=_slots_per_pod(spec),
        context=_integer(spec, "context", DEFAULT_CONTEXT, minimum=1),
        image=_text(spec, "image"),
        image_pull_policy=_text(spec, "imagePullPolicy") or DEFAULT_PULL_POLICY,
        max_gpus=_optional_integer(spec, "maxGPUs"),
        drain_grace_seconds=_integer(spec, "drainGracePeriodSeconds", DEFAULT_DRAIN_GRACE_SECONDS),
        node_selector=_mapping(spec, "nodeSelector"),
        tolerations=tuple(_list(spec, "tolerations")),
        affinity=_mapping(spec, "affinity"),
        priority_class=_text(spec, "priorityClassName"),
        autoscaling=_autoscaling(_section(spec, "autoscaling"), _slots_per_pod(spec)),
        api_keys=_secret(_section(spec, "auth"), "apiKeysSecret", "keys.yaml"),
        pod_token=_secret(_section(spec, "auth"), "podTokenSecret", "token"),
        rollout=_rollout(_section(spec, "rollout")),
        disruption_budget=_disruption_budget(_section(spec, "disruptionBudget")),
        **_resources(_section(spec, "resources")),
    )
    check(pool)
    return pool


def _model(spec: Mapping[str, Any]) -> sources.ModelSource:
    if spec.get("model") is None:
        raise InvalidPool("spec.model is required")
    try:
        return sources.read(spec["model"])
    except sources.InvalidModel as exc:
        raise InvalidPool(str(exc)) from exc


def _template(spec: Mapping[str, Any]) -> templates.PodTemplate:
    try:
        return templates.read(spec)
    except templates.InvalidTemplate as exc:
        raise InvalidPool(str(exc)) from exc


def _dtype(spec: Mapping[str, Any]) -> str:
    value = spec.get("dtype") or DEFAULT_DTYPE
    if value not in dtypes.DTYPES:
        raise InvalidPool(f"spec.dtype must be one of {', '.join(dtypes.DTYPES)}, got {value!r}")
    return str(value)


# What the operator itself sets in a server pod (children holds a test to this list):
# spec.env, spec.volumes and spec.volumeMounts may not replace it.
RESERVED_ENV = frozenset({
    "ASRPOOL_MODEL", "ASRPOOL_MODEL_REVISION", "ASRPOOL_BATCH_SIZE", "ASRPOOL_CONTEXT",
    "ASRPOOL_DEVICE", "ASRPOOL_DTYPE", "ASRPOOL_HOST", "ASRPOOL_PORT", "ASRPOOL_POOL",
    "ASRPOOL_REDIS_URL", "ASRPOOL_REDIS_PASSWORD", "ASRPOOL_DRAIN_GRACE_SECONDS",
    "ASRPOOL_API_KEYS_FILE", "ASRPOOL_ANNOUNCE_POOL", "POD_IP", "POD_NAMESPACE", "POD_NAME",
    "ASRPOOL_POD_ID", "ASRPOOL_ADVERTISE_ADDRESS", "ASRPOOL_POD_TOKEN", "HF_HUB_CACHE",
    "HF_HUB_OFFLINE", "HF_TOKEN", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_TELEMETRY",
    "HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_ETAG_TIMEOUT"})
KEYS_VOLUME, KEYS_DIR = "api-keys", "/etc/asrpool/keys"
# The read-only root's writable emptyDirs (children.WRITABLE_PATHS) are the operator's too.
RESERVED_VOLUMES = frozenset({KEYS_VOLUME, sources.MODEL_VOLUME, sources.CACHE_VOLUME,
                              "tmp", "models"})
RESERVED_MOUNTS = frozenset({KEYS_DIR, sources.MODEL_DIR, sources.CACHE_DIR, "/tmp", "/models"})


def check(pool: Pool) -> None:
    """The rules a schema cannot express; each failure says what to change."""
    if len(pool.name) > MAX_NAME_LENGTH:
        raise InvalidPool(
            f"metadata.name {pool.name!r} is {len(pool.name)} characters; pools are named at"
            f" most {MAX_NAME_LENGTH} so that their children's names and labels fit"
        )
    try:
        templates.check_reserved(pool.template, RESERVED_ENV, RESERVED_VOLUMES, RESERVED_MOUNTS)
    except templates.InvalidTemplate as exc:
        raise InvalidPool(str(exc)) from exc
    _check_autoscaling(pool)
    _check_gpu_budget(pool, pool.slots, "spec.slots")
    if pool.autoscaling.enabled:
        _check_gpu_budget(pool, pool.autoscaling.max_slots, "spec.autoscaling.maxSlots")


def check_auth(pool: Pool) -> None:
    """Pods with API keys let in a router only by its pod token: the router checks the
    client's key and never forwards it. Checked once the operator's own token (if it
    has a seed) is applied (children.with_pod_token)."""
    if pool.api_keys is not None and pool.pod_token is None:
        raise InvalidPool(
            "spec.auth.apiKeysSecret needs spec.auth.podTokenSecret (the routers' token),"
            " or an operator with a pod token seed (ASRPOOL_POD_TOKEN_SEED), which gives"
            " each pool its own: the router checks API keys and its streams reach keyed pods"
            " only with the"
            " token, so without it every client would be refused"
        )


def _check_autoscaling(pool: Pool) -> None:
    scaling = pool.autoscaling
    if not scaling.enabled:
        return
    if scaling.max_slots < 1:
        raise InvalidPool("spec.autoscaling.maxSlots must be at least 1 when autoscaling is on")
    if scaling.min_slots > scaling.max_slots:
        raise InvalidPool(
            f"spec.autoscaling.minSlots ({scaling.min_slots}) is above maxSlots"
            f" ({scaling.max_slots}); lower minSlots or raise maxSlots (minSlots left out is"
            " one pod's slots, slotsPerPod)"
        )


def _check_gpu_budget(pool: Pool, slots: int, field: str) -> None:
    if pool.max_gpus is None or pool.gpus == 0:
        return
    pods = pods_for(slots, pool.slots_per_pod)
    if pods * pool.gpus <= pool.max_gpus:
        return
    reachable = (pool.max_gpus // pool.gpus) * pool.slots_per_pod
    raise InvalidPool(
        f"{field}={slots} needs {pods} pods x {pool.gpus} GPU = {pods * pool.gpus} GPUs, over"
        f" spec.maxGPUs={pool.max_gpus}; lower {field} to at most {reachable}, raise"
        f" spec.maxGPUs to {pods * pool.gpus}, or raise spec.slotsPerPod"
    )


def _slots_per_pod(spec: Mapping[str, Any]) -> int:
    return _integer(spec, "slotsPerPod", DEFAULT_SLOTS_PER_POD, minimum=1)


def _autoscaling(raw: Mapping[str, Any], slots_per_pod: int) -> Autoscaling:
    """``minSlots`` defaults to one pod's slots: a pool goes to zero only when told to."""
    return Autoscaling(
        enabled=_flag(raw, "enabled"),
        min_slots=_integer(raw, "minSlots", slots_per_pod, where="autoscaling."),
        max_slots=_integer(raw, "maxSlots", 0, where="autoscaling."),
        target_free_fraction=_number(raw, "targetFreeFraction", 0.25),
        scale_up_seconds=_number(raw, "scaleUpStabilizationSeconds", 0.0),
        scale_down_seconds=_number(raw, "scaleDownStabilizationSeconds", 300.0),
        behavior=_behavior(_section(raw, "behavior", where="autoscaling.")),
    )


def _behavior(raw: Mapping[str, Any]) -> Behavior:
    return Behavior(
        scale_up=_rules(raw, "scaleUp", DEFAULT_SCALE_UP),
        scale_down=_rules(raw, "scaleDown", DEFAULT_SCALE_DOWN),
    )


def _rules(raw: Mapping[str, Any], field: str, default: ScalingRules) -> ScalingRules:
    """One direction's rules; each part left out keeps the HPA's default."""
    where = f"autoscaling.behavior.{field}."
    section = _section(raw, field, where="autoscaling.behavior.")
    select = _text(section, "selectPolicy", where=where) or default.select
    if select not in ("Max", "Min", "Disabled"):
        raise InvalidPool(f"spec.{where}selectPolicy must be Max, Min or Disabled, got {select!r}")
    if "policies" not in section:
        return ScalingRules(select, default.policies)
    return ScalingRules(select, tuple(_policy(item, f"{where}policies[{i}].")
                                      for i, item in enumerate(_list(section, "policies"))))


def _policy(raw: Mapping[str, Any], where: str) -> ScalingPolicy:
    kind = _text(raw, "type", required=True, where=where)
    if kind not in ("Pods", "Percent"):
        raise InvalidPool(f"spec.{where}type must be Pods or Percent, got {kind!r}")
    return ScalingPolicy(kind, _integer(raw, "value", required=True, minimum=1, where=where),
                         float(_integer(raw, "periodSeconds", required=True, minimum=1,
                                        where=where)))


def _resources(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "gpus": _integer(raw, "gpus", 1, where="resources."),
        "gpu_resource": _text(raw, "gpuResourceName", where="resources.") or DEFAULT_GPU_RESOURCE,
        "cpu": _quantity(raw, "cpu"),
        "memory": _quantity(raw, "memory"),
    }


def _secret(raw: Mapping[str, Any], field: str, default_key: str) -> SecretKey | None:
    if raw.get(field) is None:
        return None
    ref = _section(raw, field, where="auth.")
    name = _text(ref, "name", required=True, where=f"auth.{field}.")
    return SecretKey(name=name, key=_text(ref, "key", where=f"auth.{field}.") or default_key)


def _section(raw: Mapping[str, Any], field: str, *, where: str = "") -> Mapping[str, Any]:
    value = raw.get(field) or {}
    if not isinstance(value, Mapping):
        raise InvalidPool(f"spec.{where}{field} must be an object, got {type(value).__name__}")
    return value


def _integer(
    raw: Mapping[str, Any],
    field: str,
    default: int = 0,
    *,
    required: bool = False,
    minimum: int = 0,
    where: str = "",
) -> int:
    if field not in raw:
        if required:
            raise InvalidPool(f"spec.{where}{field} is required")
        return default
    value = raw[field]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidPool(f"spec.{where}{field} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidPool(f"spec.{where}{field} must be at least {minimum}, got {value}")
    return value


def _optional_integer(raw: Mapping[str, Any], field: str) -> int | None:
    return _integer(raw, field) if raw.get(field) is not None else None


def _number(raw: Mapping[str, Any], field: str, default: float) -> float:
    value = raw.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidPool(f"spec.autoscaling.{field} must be a non-negative number, got {value!r}")
    return float(value)


def _flag(raw: Mapping[str, Any], field: str) -> bool:
    value = raw.get(field, False)
    if not isinstance(value, bool):
        raise InvalidPool(f"spec.autoscaling.{field} must be true or false, got {value!r}")
    return value


def _text(raw: Mapping[str, Any], field: str, *, required: bool = False, where: str = "") -> str:
    value = raw.get(field)
    if value is None or value == "":
        if required:
            raise InvalidPool(f"spec.{where}{field} is required")
        return ""
    if not isinstance(value, str):
        raise InvalidPool(f"spec.{where}{field} must be a string, got {value!r}")
    return value


def _quantity(raw: Mapping[str, Any], field: str) -> str:
    value = raw.get(field)
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidPool(f"spec.resources.{field} must be a quantity like '4' or '16Gi'")
    return str(value)


def _mapping(raw: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    return dict(_section(raw, field))


def _list(raw: Mapping[str, Any], field: str) -> list[Mapping[str, Any]]:
    value = raw.get(field) or []
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise InvalidPool(f"spec.{field} must be a list of objects")
    return value


def _rollout(raw: Mapping[str, Any]) -> Rollout:
    rollout = Rollout(
        max_surge=_int_or_percent(raw, "maxSurge", 1, where="rollout."),
        max_unavailable=_int_or_percent(raw, "maxUnavailable", 0, where="rollout."),
    )
    if _is_zero(rollout.max_surge) and _is_zero(rollout.max_unavailable):
        raise InvalidPool("spec.rollout.maxSurge and maxUnavailable are both 0: a rollout could"
                          " never move; raise one of them (maxSurge 1 needs one spare GPU)")
    return rollout


def _disruption_budget(raw: Mapping[str, Any]) -> DisruptionBudget:
    if "maxUnavailable" in raw and "minAvailable" in raw:
        raise InvalidPool("spec.disruptionBudget takes maxUnavailable or minAvailable, not both")
    if "minAvailable" in raw:
        minimum = _int_or_percent(raw, "minAvailable", 0, where="disruptionBudget.")
        return DisruptionBudget(max_unavailable=None, min_available=minimum)
    return DisruptionBudget(
        max_unavailable=_int_or_percent(raw, "maxUnavailable", 1, where="disruptionBudget."))


_PERCENT = re.compile(r"(100|[1-9]?[0-9])%")


def _int_or_percent(raw: Mapping[str, Any], field: str, default: IntOrPercent, *,
                    where: str) -> IntOrPercent:
    value = raw.get(field, default)
    if isinstance(value, str) and _PERCENT.fullmatch(value):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InvalidPool(f"spec.{where}{field} must be a whole number of pods or a percentage"
                      f" like '25%', got {value!r}")


def _is_zero(value: IntOrPercent) -> bool:
    return value in (0, "0%")
