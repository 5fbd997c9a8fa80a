"""A pool's status, computed from what was observed: pure, so a repeat changes nothing.

Conditions follow the Kubernetes convention (``type``, ``status``, ``reason``,
``message``, ``lastTransitionTime``); a condition keeps its transition time while its
status stays the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from asrpool.common import weights
from asrpool.operator import naming, usage


@dataclasses.dataclass(frozen=True)
class Problem:
    # InvalidSpec, RegistryUnavailable, RedisUserMissing, NameConflict, ApplyFailed,
    # ProgressDeadlineExceeded, PodsUnschedulable, ImagePullBackOff, CrashLoopBackOff,
    # CreateContainerConfigError, CreateContainerError, RunContainerError, and for a model
    # that cannot be had (weights.EXIT_REASONS): ModelUnavailable, RegistryUnavailable (the
    # Hugging Face Hub), ModelCacheUnavailable
    reason: str
    message: str


# A container waiting for one of these will not get better by itself. An image the node
# cannot have (absent with pull policy Never, a name that does not parse) is reported as
# a pull that cannot succeed; the kubelet's message says which.
STUCK_CONTAINERS = {"ErrImagePull": "ImagePullBackOff", "ImagePullBackOff": "ImagePullBackOff",
                    "ErrImageNeverPull": "ImagePullBackOff",
                    "InvalidImageName": "ImagePullBackOff",
                    "CrashLoopBackOff": "CrashLoopBackOff",
                    "CreateContainerConfigError": "CreateContainerConfigError",
                    "CreateContainerError": "CreateContainerError",
                    "RunContainerError": "RunContainerError"}


def pod_problem(deployment: Mapping[str, Any] | None,
                pods: Sequence[Mapping[str, Any]]) -> Problem | None:
    """What keeps the pool's pods from serving, read as a platform team would read it:
    the Deployment's progress deadline, the scheduler's verdict, a stuck container."""
    for condition in (deployment or {}).get("status", {}).get("conditions") or []:
        if condition.get("reason") == "ProgressDeadlineExceeded":
            return Problem("ProgressDeadlineExceeded", str(condition.get("message", "")))
    live = [pod for pod in pods if not pod.get("metadata", {}).get("deletionTimestamp")]
    unschedulable = [(pod, c) for pod in live for c in _conditions(pod)
                     if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"]
    if unschedulable:
        _, condition = unschedulable[0]
        return Problem("PodsUnschedulable", f"{len(unschedulable)} server pod(s) cannot be "
                       f"scheduled: {condition.get('message', '')}")
    return _model_problem(live) or _stuck_container(live)


def _stuck_container(pods: Sequence[Mapping[str, Any]]) -> Problem | None:
    for pod in pods:
        for container in _container_statuses(pod):
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = STUCK_CONTAINERS.get(waiting.get("reason", ""))
            if reason:
                where = f"{pod['metadata']['name']}/{container.get('name')}"
                said = waiting.get("message") or waiting["reason"]
                return Problem(reason, f"{where}: {said}{_last_words(container)}")
    return None


def _last_words(container: Mapping[str, Any]) -> str:
    """The last line a crashed container wrote (its termination message: the server
    containers fall back to their log), so the status says why, not only that."""
    ended = ((container.get("lastState") or {}).get("terminated")) or {}
    line = last_line(ended.get("message", ""))
    return f" (exit code {ended.get('exitCode')}: {line})" if line else ""


def _model_problem(pods: Sequence[Mapping[str, Any]]) -> Problem | None:
    """A container that last exited with one of the model exit codes: its reason, and the
    last line it wrote (its termination message). The message names the container, not
    the pod, so that the pool's pods failing alike make one problem, hence one event.
    A retry in progress (the fetch running again, a server loading again) is still the
    problem until it succeeds: the status does not flap, nor the events repeat."""
    for pod in pods:
        for container in _container_statuses(pod):
            state, last = container.get("state") or {}, container.get("lastState") or {}
            ended = state.get("terminated") or last.get("terminated") or {}
            reason = weights.EXIT_REASONS.get(int(ended.get("exitCode") or 0))
            if reason is not None and not _recovered(container):
                return Problem(reason, f"container {container.get('name')}: "
                               f"{last_line(ended.get('message', '')) or ended.get('reason')}")
    return None


def _recovered(container: Mapping[str, Any]) -> bool:
    """A server container that is ready again (an init container that succeeded has
    exit code 0, so it never gets here)."""
    return not container.get("init") and bool(container.get("ready"))


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _container_statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Init containers first: a pod whose init container is stuck never starts the others."""
    status = pod.get("status") or {}
    return [*({**c, "init": True} for c in status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or [])]


def _conditions(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((pod.get("status") or {}).get("conditions") or [])


# Where status.slotsPerPod comes from (status.slotsPerPodFrom).
SPEC = "spec"
MEASURED = "measured"  # slotsPerPod: auto, as the pool's pods measured it (the most)
FIRST_POD = "first pod measuring"  # slotsPerPod: auto, no pod has measured yet: one pod


@dataclasses.dataclass(frozen=True)
class SlotsPerPod:
    """What the operator sizes the pool's pods with, and where it comes from."""

    slots: int
    sized_by: str = SPEC


@dataclasses.dataclass(frozen=True)
class Observed:
    """Everything the status is made of."""

    pool_name: str
    generation: int | None
    desired_pods: int
    deployment: Mapping[str, Any] | None
    slot_use: usage.Usage | None
    problem: Problem | None = None
    slots_per_pod: SlotsPerPod | None = None  # None: the spec is invalid
    url: str | None = None  # where clients stream to the pool (status.url)


def build(observed: Observed, previous: Mapping[str, Any], now: str) -> dict[str, Any]:
    status: dict[str, Any] = {
        "replicas": observed.desired_pods,
        "readyReplicas": _ready(observed.deployment),
        "updatedReplicas": _field(observed.deployment, "updatedReplicas"),
        "selector": naming.selector_text(observed.pool_name),
    }
    if observed.generation is not None:
        status["observedGeneration"] = observed.generation
    status.update(_slot_fields(observed.slot_use, previous))
    if observed.slots_per_pod is not None:
        status["slotsPerPod"] = observed.slots_per_pod.slots
        status["slotsPerPodFrom"] = observed.slots_per_pod.sized_by
    if observed.url is not None:
        status["url"] = observed.url
    status["conditions"] = conditions(observed, previous.get("conditions") or [], now)
    return status


def _slot_fields(slot_use: usage.Usage | None, previous: Mapping[str, Any]) -> dict[str, int]:
    if slot_use is None:  # Redis unreadable: keep the last known figures
        keys = ("slots", "freeSlots", "activeStreams")
        return {key: previous[key] for key in keys if key in previous}
    return {
        "slots": slot_use.slots,
        "freeSlots": slot_use.free_slots,
        "activeStreams": slot_use.active_streams,
    }


def conditions(
    observed: Observed, previous: Sequence[Mapping[str, Any]], now: str
) -> list[dict[str, Any]]:
    made = [_ready_condition(observed), _progressing(observed), _degraded(observed),
            _overloaded(observed)]
    return [_stamp(condition, previous, now, observed.generation) for condition in made]


def _ready_condition(observed: Observed) -> dict[str, Any]:
    ready, wanted = _ready(observed.deployment), observed.desired_pods
    if observed.deployment is None and observed.problem is not None:
        return _condition("Ready", False, observed.problem.reason, "no server pods yet")
    if wanted == 0:
        return _condition("Ready", True, "ScaledToZero", "spec.slots is 0: no server pods")
    message = f"{ready}/{wanted} server pods ready"
    if observed.slot_use is not None:
        message += f"; {observed.slot_use.free_slots} of {observed.slot_use.slots} slots free"
    if ready >= wanted:
        return _condition("Ready", True, "PodsReady", message)
    return _condition("Ready", False, "PodsNotReady", message)


def _progressing(observed: Observed) -> dict[str, Any]:
    if observed.problem is not None and observed.problem.reason == "InvalidSpec":
        return _condition("Progressing", False, "InvalidSpec", "waiting for a valid spec")
    pending = _rollout_pending(observed)
    if pending:
        return _condition("Progressing", True, "RollingOut", pending)
    return _condition("Progressing", False, "Stable", "every server pod is up to date and ready")


def _rollout_pending(observed: Observed) -> str:
    deployment, wanted = observed.deployment, observed.desired_pods
    if deployment is None:
        return "creating the Deployment"
    seen = deployment.get("status", {}).get("observedGeneration")
    generation = deployment.get("metadata", {}).get("generation")
    if seen is not None and generation is not None and seen < generation:
        return "the Deployment controller has not seen the latest spec yet"
    updated, total = _field(deployment, "updatedReplicas"), _field(deployment, "replicas")
    ready = _ready(deployment)
    if updated < wanted or ready < wanted or total > wanted:
        return f"{updated}/{wanted} pods updated, {ready} ready, {total} running"
    return ""


def _degraded(observed: Observed) -> dict[str, Any]:
    if observed.problem is not None:
        return _condition("Degraded", True, observed.problem.reason, observed.problem.message)
    return _condition("Degraded", False, "AsExpected", "the pool matches its spec")


def _overloaded(observed: Observed) -> dict[str, Any]:
    """Pods behind real time, which admit no new stream until they catch up (and shed
    their newest past a hard bound): the pool has fewer slots than its pods say."""
    if observed.slot_use is None:
        return {**_condition("Overloaded", False, "Unknown", "Redis cannot be read"),
                "status": "Unknown"}
    pods = observed.slot_use.overloaded_pods
    if pods:
        return _condition("Overloaded", True, "BehindRealTime",
                          f"behind real time, admitting no new stream: {', '.join(pods)}")
    return _condition("Overloaded", False, "KeepingUp", "every server pod keeps real time")


def _condition(kind: str, status: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": kind, "status": "True" if status else "False", "reason": reason,
            "message": message}


def _stamp(
    condition: dict[str, Any], previous: Sequence[Mapping[str, Any]], now: str,
    generation: int | None,
) -> dict[str, Any]:
    before = next((c for c in previous if c.get("type") == condition["type"]), {})
    kept = before.get("status") == condition["status"] and before.get("lastTransitionTime")
    stamped = {**condition, "lastTransitionTime": kept or now}
    if generation is not None:
        stamped["observedGeneration"] = generation
    return stamped


def _ready(deployment: Mapping[str, Any] | None) -> int:
    return _field(deployment, "readyReplicas")


def _field(deployment: Mapping[str, Any] | None, name: str) -> int:
    if deployment is None:
        return 0
    return int((deployment.get("status") or {}).get(name) or 0)


def changed(previous: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether writing ``status`` would change anything that is there."""
    return any(previous.get(key) != value for key, value in status.items())
