"""A ``StreamingASRPool`` read into a typed, checked value.

The CRD's schema rejects most bad input at the API server. What it cannot see (a pool
that needs more GPUs than it may use, autoscaling bounds out of order, a name too long
for its children) is checked here, and :class:`~asrpool.operator.specs.InvalidSpec`
says what to fix (the fields are read by :mod:`~asrpool.operator.specs`). The CRD's
defaults are applied first, from the CRD itself (:mod:`~asrpool.common.crd`):
an API server that skipped defaulting, or an older CRD, must not change what the
operator builds, and no default is written twice. The defaults here are those the CRD
leaves to the operator (it says so in its descriptions).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from asrpool.common import crd, dtypes, limits
from asrpool.operator import naming, sources, specs, templates

MAX_NAME_LENGTH = 50  # children are named after the pool; label values stop at 63
AUTO = "auto"
MAX_OPUS_WORKERS = 64  # as the server's --opus-workers
# A pool that names no opusWorkers gets a lane per core of its CPU request beyond these
# (the event loop's and the engine's), and one at the least: Opus leaves the event loop.
CORES_BESIDE_OPUS_LANES = 2
MAX_INTAKE_WORKERS = 64  # as the server's --intake-workers


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
    enabled: bool
    min_slots: int  # left out: one pod's slots
    max_slots: int
    target_free_fraction: float
    scale_up_seconds: float
    scale_down_seconds: float
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
    """What the operator needs of one pool, defaults applied (:func:`from_body`)."""

    name: str
    namespace: str
    model: str
    revision: str
    source: sources.ModelSource  # spec.model, read
    dtype: str
    template: templates.PodTemplate  # pod template pass-through
    slots: int
    slots_per_pod: int
    # slotsPerPod: auto: each pod measures its engine (serve --batch-size auto), and
    # slots_per_pod is what the pool's live pods measured (usage.measured_slots), or,
    # before any did, the whole pool's slots: one pod first, to measure.
    auto_slots: bool
    context: int
    image: str
    image_pull_policy: str
    max_gpus: int | None
    drain_grace_seconds: int
    opus_workers: int
    intake_workers: int
    engine_process: bool
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    affinity: Mapping[str, Any]
    priority_class: str
    autoscaling: Autoscaling
    api_keys: SecretKey | None
    pod_token: SecretKey | None
    rollout: Rollout
    disruption_budget: DisruptionBudget
    gpus: int
    gpu_resource: str
    cpu: str
    memory: str

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


def from_body(body: Mapping[str, Any], measured_slots: int | None = None) -> Pool:
    """Read and check a pool object (``metadata`` and ``spec``); raise
    :class:`~asrpool.operator.specs.InvalidSpec`. ``measured_slots``: the slots its live
    pods measured for themselves (``slotsPerPod: auto``), if any reported."""
    meta = body.get("metadata", {})
    spec = specs.Section("spec", crd.defaulted(crd.pool_spec(), body.get("spec") or {}))
    namespace = str(meta.get("namespace") or "default")
    source, template = _model(spec, namespace), templates.read(spec)
    auto = spec.get("slotsPerPod") == AUTO
    slots_per_pod = _slots_per_pod(spec, measured_slots)
    pool = Pool(
        name=str(meta.get("name", "")),
        namespace=namespace,
        model=source.reference,
        revision=source.revision,
        source=source,
        dtype=_dtype(spec),
        template=template,
        slots=spec.integer("slots", required=True),
        slots_per_pod=slots_per_pod,
        auto_slots=auto,
        context=spec.integer("context", required=True, minimum=1),
        image=spec.text("image"),
        image_pull_policy=spec.text("imagePullPolicy", required=True),
        max_gpus=spec.optional_integer("maxGPUs"),
        drain_grace_seconds=spec.integer("drainGracePeriodSeconds", required=True),
        opus_workers=_workers(spec, "opusWorkers", MAX_OPUS_WORKERS),
        intake_workers=_workers(spec, "intakeWorkers", MAX_INTAKE_WORKERS),
        engine_process=spec.boolean("engineProcess"),
        node_selector=spec.mapping("nodeSelector"),
        tolerations=spec.objects("tolerations"),
        affinity=spec.mapping("affinity"),
        priority_class=spec.text("priorityClassName"),
        autoscaling=_autoscaling(spec.defaulted("autoscaling", crd.pool_spec()),
                                 slots_per_pod),
        api_keys=_secret(spec.section("auth"), "apiKeysSecret", "keys.yaml"),
        pod_token=_secret(spec.section("auth"), "podTokenSecret", "token"),
        rollout=_rollout(spec.section("rollout")),
        disruption_budget=_disruption_budget(spec.section("disruptionBudget")),
        **_resources(spec.defaulted("resources", crd.pool_spec())),
    )
    if spec.get("opusWorkers") is None:
        cores = _cores(spec.section("resources"), pool.cpu)
        pool = dataclasses.replace(pool, opus_workers=lanes_for_cpu(cores))
    if spec.get("engineProcess") is None:  # where it wins: beside a GPU's engine
        pool = dataclasses.replace(pool, engine_process=pool.gpus > 0)
    if spec.get("intakeWorkers") is None:  # where they win: a GPU's hundreds of streams
        workers = limits.GPU_INTAKE_WORKERS if pool.gpus else 0
        pool = dataclasses.replace(pool, intake_workers=workers)
    check(pool)
    return pool


def _model(spec: specs.Section, namespace: str) -> sources.ModelSource:
    model = spec.optional_section("model")
    if model is None:
        raise spec.error("model", "is required")
    return sources.read(model, namespace)


def _workers(spec: specs.Section, field: str, most: int) -> int:
    """The pool's ``opusWorkers`` or ``intakeWorkers`` (where it names none,
    ``from_body`` derives them: :func:`lanes_for_cpu`, :data:`limits.GPU_INTAKE_WORKERS`)."""
    workers = spec.integer(field)
    if workers > most:
        raise spec.error(field, f"must be at most {most}, got {workers}")
    return workers


def _dtype(spec: specs.Section) -> str:
    value = spec.get("dtype")
    if value not in dtypes.DTYPES:
        raise spec.error("dtype", f"must be one of {', '.join(dtypes.DTYPES)}, got {value!r}")
    return str(value)


# What the operator itself sets in a server pod (children holds a test to this list):
# spec.env, spec.volumes and spec.volumeMounts may not replace it.
RESERVED_ENV = frozenset({
    "ASRPOOL_MODEL", "ASRPOOL_MODEL_REVISION", "ASRPOOL_BATCH_SIZE", "ASRPOOL_CONTEXT",
    "ASRPOOL_DEVICE", "ASRPOOL_DTYPE", "ASRPOOL_HOST", "ASRPOOL_PORT", "ASRPOOL_POOL",
    "ASRPOOL_REDIS_URL", "ASRPOOL_REDIS_PASSWORD", "ASRPOOL_DRAIN_GRACE_SECONDS",
    "ASRPOOL_OPUS_WORKERS", "ASRPOOL_INTAKE_WORKERS", "ASRPOOL_ENGINE_PROCESS",
    "ASRPOOL_API_KEYS_FILE", "ASRPOOL_ANNOUNCE_POOL", "POD_IP", "POD_NAMESPACE", "POD_NAME",
    "ASRPOOL_POD_ID", "ASRPOOL_ADVERTISE_ADDRESS", "ASRPOOL_POD_TOKEN", "HF_HUB_CACHE",
    "HF_HUB_OFFLINE", "HF_TOKEN", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_TELEMETRY",
    "HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_ETAG_TIMEOUT"})
# The reserved variables a spec field sets: a refusal of one in spec.env names its field.
ENV_FIELDS = {"ASRPOOL_BATCH_SIZE": "spec.slotsPerPod", "ASRPOOL_CONTEXT": "spec.context",
              "ASRPOOL_DTYPE": "spec.dtype", "ASRPOOL_OPUS_WORKERS": "spec.opusWorkers",
              "ASRPOOL_INTAKE_WORKERS": "spec.intakeWorkers",
              "ASRPOOL_ENGINE_PROCESS": "spec.engineProcess",
              "ASRPOOL_DRAIN_GRACE_SECONDS": "spec.drainGracePeriodSeconds",
              "ASRPOOL_MODEL": "spec.model", "ASRPOOL_MODEL_REVISION": "spec.model.revision",
              "ASRPOOL_DEVICE": "spec.resources.gpus"}
KEYS_VOLUME, KEYS_DIR = "api-keys", "/etc/asrpool/keys"
# The read-only root's writable emptyDirs (children.WRITABLE_PATHS) are the operator's too.
RESERVED_VOLUMES = frozenset({KEYS_VOLUME, sources.MODEL_VOLUME, sources.CACHE_VOLUME,
                              "tmp", "models"})
RESERVED_MOUNTS = frozenset({KEYS_DIR, sources.MODEL_DIR, sources.CACHE_DIR, "/tmp", "/models"})


def check(pool: Pool) -> None:
    """The rules a schema cannot express; each failure says what to change."""
    if len(pool.name) > MAX_NAME_LENGTH:
        raise specs.InvalidSpec(
            f"metadata.name {pool.name!r} is {len(pool.name)} characters; pools are named at"
            f" most {MAX_NAME_LENGTH} so that their children's names and labels fit"
        )
    templates.check_reserved(pool.template, RESERVED_ENV, RESERVED_VOLUMES, RESERVED_MOUNTS,
                             ENV_FIELDS)
    _check_autoscaling(pool)
    _check_gpu_budget(pool, pool.slots, "spec.slots")
    if pool.autoscaling.enabled:
        _check_gpu_budget(pool, pool.autoscaling.max_slots, "spec.autoscaling.maxSlots")


def check_release_namespace(pool: Pool, release_namespace: str | None,
                            service_account: str | None) -> None:
    """A pool in the operator's own namespace may name neither the operator's service
    account nor any Secret: the operator would run its pods with what the pool's writer
    may not have (the Redis admin password, the seeds, the operator's rights). Pools
    elsewhere are for their namespace's own RBAC."""
    if release_namespace is None or pool.namespace != release_namespace:
        return
    if service_account and pool.template.service_account == service_account:
        raise specs.InvalidSpec(
            f"spec.serviceAccountName: {service_account!r} is the operator's own service "
            "account; server pods may not run as it (name another, or none)")
    named = [*(f"{field}: {ref.name}" for field, ref in (
        ("spec.auth.apiKeysSecret", pool.api_keys), ("spec.auth.podTokenSecret", pool.pod_token))
        if ref is not None)]
    if pool.source.token is not None:
        named.append(f"spec.model.tokenSecret: {pool.source.token.secret}")
    named += templates.secret_references(pool.template)
    if named:
        raise specs.InvalidSpec(
            f"{named[0]} names a Secret, and pools in the operator's namespace "
            f"{release_namespace!r} may name none (its Secrets hold the platform's own "
            "credentials); put the pool in a namespace of its own")


def check_auth(pool: Pool) -> None:
    """Pods with API keys let in a router only by its pod token: the router checks the
    client's key and never forwards it. Checked once the operator's own token (if it
    has a seed) is applied (children.with_pod_token)."""
    if pool.api_keys is not None and pool.pod_token is None:
        raise specs.InvalidSpec(
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
        raise specs.InvalidSpec("spec.autoscaling.maxSlots must be at least 1 when autoscaling"
                                " is on")
    if scaling.min_slots > scaling.max_slots:
        raise specs.InvalidSpec(
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
    raise specs.InvalidSpec(
        f"{field}={slots} needs {pods} pods x {pool.gpus} GPU = {pods * pool.gpus} GPUs, over"
        f" spec.maxGPUs={pool.max_gpus}; lower {field} to at most {reachable}, raise"
        f" spec.maxGPUs to {pods * pool.gpus}, or raise spec.slotsPerPod"
    )


def _slots_per_pod(spec: specs.Section, measured: int | None) -> int:
    """The number, or with ``auto`` what the pods measured; before any did, the pool's
    slots (at least 1): one pod, which measures."""
    if isinstance(spec.get("slotsPerPod"), str) and spec.get("slotsPerPod") != AUTO:
        raise spec.error("slotsPerPod", f"must be an integer or {AUTO}, got "
                         f"{spec.get('slotsPerPod')!r}")
    if spec.get("slotsPerPod") != AUTO:
        slots = spec.integer("slotsPerPod", required=True, minimum=1)
        if slots > limits.MAX_SLOTS_PER_POD:  # the CRD's rule, which a schema check skips
            raise spec.error("slotsPerPod", f"must be a whole number from 1 to "
                                            f"{limits.MAX_SLOTS_PER_POD}, or {AUTO}")
        return slots
    if measured:
        return measured
    return max(1, spec.integer("slots"))


def _autoscaling(scaling: specs.Section, slots_per_pod: int) -> Autoscaling:
    """``minSlots`` defaults to one pod's slots: a pool goes to zero only when told to."""
    return Autoscaling(
        enabled=scaling.boolean("enabled"),
        min_slots=scaling.integer("minSlots", slots_per_pod),
        max_slots=scaling.integer("maxSlots", 0),
        target_free_fraction=_number(scaling, "targetFreeFraction"),
        scale_up_seconds=_number(scaling, "scaleUpStabilizationSeconds"),
        scale_down_seconds=_number(scaling, "scaleDownStabilizationSeconds"),
        behavior=_behavior(scaling.section("behavior")),
    )


def _behavior(behavior: specs.Section) -> Behavior:
    return Behavior(
        scale_up=_rules(behavior.section("scaleUp"), DEFAULT_SCALE_UP),
        scale_down=_rules(behavior.section("scaleDown"), DEFAULT_SCALE_DOWN),
    )


def _rules(rules: specs.Section, default: ScalingRules) -> ScalingRules:
    """One direction's rules; each part left out keeps the HPA's default."""
    select = rules.text("selectPolicy") or default.select
    if select not in ("Max", "Min", "Disabled"):
        raise rules.error("selectPolicy", f"must be Max, Min or Disabled, got {select!r}")
    if "policies" not in rules:
        return ScalingRules(select, default.policies)
    return ScalingRules(select, tuple(_policy(item) for item in rules.sections("policies")))


def _policy(policy: specs.Section) -> ScalingPolicy:
    kind = policy.text("type", required=True)
    if kind not in ("Pods", "Percent"):
        raise policy.error("type", f"must be Pods or Percent, got {kind!r}")
    return ScalingPolicy(kind, policy.integer("value", required=True, minimum=1),
                         float(policy.integer("periodSeconds", required=True, minimum=1)))


def _resources(resources: specs.Section) -> dict[str, Any]:
    return {
        "gpus": resources.integer("gpus", required=True),
        "gpu_resource": resources.text("gpuResourceName", required=True),
        "cpu": _quantity(resources, "cpu"),
        "memory": _quantity(resources, "memory"),
    }


def lanes_for_cpu(cores: float | None) -> int:
    """Opus lanes for a pod of ``cores`` CPU cores requested (None: no request)."""
    if cores is None:
        return 1
    return max(1, min(MAX_OPUS_WORKERS, math.floor(cores) - CORES_BESIDE_OPUS_LANES))


def _cores(resources: specs.Section, cpu: str) -> float | None:
    if not cpu:
        return None
    from kubernetes.utils import quantity  # the client loads only where a pool asks for it

    try:
        return float(quantity.parse_quantity(cpu))
    except ValueError:
        raise resources.error("cpu", f"must be a CPU quantity like '4' or '1500m', got "
                                     f"{cpu!r}") from None


def _secret(auth: specs.Section, field: str, default_key: str) -> SecretKey | None:
    if auth.get(field) is None:
        return None
    ref = auth.section(field)
    return SecretKey(name=ref.text("name", required=True), key=ref.text("key") or default_key)


def _number(section: specs.Section, field: str) -> float:
    """A number the CRD gives a default (so it is there)."""
    value = section.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise section.error(field, f"must be a non-negative number, got {value!r}")
    return float(value)


def _quantity(resources: specs.Section, field: str) -> str:
    value = resources.get(field)
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise resources.error(field, "must be a quantity like '4' or '16Gi'")
    return str(value)


def _rollout(section: specs.Section) -> Rollout:
    rollout = Rollout(
        max_surge=_int_or_percent(section, "maxSurge", 1),
        max_unavailable=_int_or_percent(section, "maxUnavailable", 0),
    )
    if _is_zero(rollout.max_surge) and _is_zero(rollout.max_unavailable):
        raise section.error("maxSurge", "and maxUnavailable are both 0: a rollout could never"
                                        " move; raise one of them (maxSurge 1 needs one spare"
                                        " GPU)")
    return rollout


def _disruption_budget(budget: specs.Section) -> DisruptionBudget:
    if "maxUnavailable" in budget and "minAvailable" in budget:
        raise budget.invalid("takes maxUnavailable or minAvailable, not both")
    if "minAvailable" in budget:
        minimum = _int_or_percent(budget, "minAvailable", 0)
        return DisruptionBudget(max_unavailable=None, min_available=minimum)
    return DisruptionBudget(max_unavailable=_int_or_percent(budget, "maxUnavailable", 1))


_PERCENT = re.compile(r"(100|[1-9]?[0-9])%")


def _int_or_percent(section: specs.Section, field: str, default: IntOrPercent) -> IntOrPercent:
    value = section.get(field, default)
    if isinstance(value, str) and _PERCENT.fullmatch(value):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise section.error(field, "must be a whole number of pods or a percentage like '25%',"
                               f" got {value!r}")


def _is_zero(value: IntOrPercent) -> bool:
    return value in (0, "0%")
