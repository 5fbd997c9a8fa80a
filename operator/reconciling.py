"""One pass over one pool: read the spec, build, adopt, protect streams, apply, observe.

Handlers call :func:`reconcile` and turn its :class:`Result` into a status patch,
events and kopf errors. Every step is idempotent: a pass over a pool that is already
right reads the API and writes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import kopf
import redis
import redis.asyncio as aioredis

from asrpool.common import redis_acl, registry
from asrpool.operator import (
    applying,
    children,
    kube,
    membership,
    naming,
    pools,
    settings,
    specs,
    statuses,
    usage,
)

REDIS_RETRY_SECONDS = 5


@dataclasses.dataclass
class Context:
    """What every handler needs, built once at start-up and kept in kopf's memo."""

    config: settings.OperatorSettings
    kube: kube.Kube
    redis: aioredis.Redis
    published: membership.Published = dataclasses.field(default_factory=membership.Published)


@dataclasses.dataclass(frozen=True)
class Result:
    pool: pools.Pool | None  # None when the spec is invalid
    observed: statuses.Observed
    actions: list[applying.Applied]
    scaled_from: int | None = None  # server pods before, when this pass changed them
    costs_set: int = 0  # pods whose deletion cost this pass wrote

    @property
    def invalid(self) -> str | None:
        problem = self.observed.problem
        return problem.message if problem and problem.reason == "InvalidSpec" else None


async def reconcile(context: Context, body: kopf.Body) -> Result:
    name, namespace = body.metadata.name or "", body.metadata.namespace or "default"
    beats = await _read_beats(context, naming.registry_name(namespace, name))
    measured = _measured(body, beats)
    try:
        written = pools.from_body(body, measured)
        pools.check_release_namespace(written, context.config.release_namespace,
                                      context.config.service_account)
        pool = children.with_pod_token(written, context.config)
        pools.check_auth(pool)
    except specs.InvalidSpec as exc:
        return await _observe_invalid(context, body, str(exc), beats)
    built = children.build_all(pool, context.config)
    kopf.adopt(built, owner=body)
    deployment = await _deployment(context, pool.namespace, pool.name)
    current = _replicas(deployment)
    costs_set = await _protect_streams(context, pool, current, beats)
    user_problem = await _ensure_redis_user(context, pool)
    actions = await applying.apply_all(context.kube, built)
    deployment = await _deployment(context, pool.namespace, pool.name)
    pods = await context.kube.list(kube.PODS, pool.namespace, naming.selector(pool.name))
    await _publish_members(context, pool, pods)
    problem = (user_problem or _name_conflict(actions) or _apply_failed(actions)
               or statuses.pod_problem(deployment, pods))
    observed = dataclasses.replace(
        _observed(body, pool.name, pool.pods, deployment, beats, problem),
        slots_per_pod=statuses.SlotsPerPod(pool.slots_per_pod, _sized_by(pool, measured)),
        url=naming.streaming_url(context.config.router_url, pool.registry_name))
    scaled_from = current if current is not None and current != pool.pods else None
    return Result(pool, observed, actions, scaled_from, costs_set)


def _measured(body: kopf.Body, beats: list[registry.PodHeartbeat] | None) -> int | None:
    """What a ``slotsPerPod: auto`` pool's pods measured: its live pods' heartbeats, or,
    while none serves (Redis away, every pod draining or starting), what the status last
    recorded, never the one-pod start again."""
    measured = usage.measured_slots(beats or [])
    if measured:
        return measured
    status = body.get("status") or {}
    recorded = status.get("slotsPerPod")
    if status.get("slotsPerPodFrom") == statuses.MEASURED and isinstance(recorded, int):
        return recorded
    return None


def _sized_by(pool: pools.Pool, measured: int | None) -> str:
    if not pool.auto_slots:
        return statuses.SPEC
    return statuses.MEASURED if measured else statuses.FIRST_POD


async def _observe_invalid(context: Context, body: kopf.Body, message: str,
                           beats: list[registry.PodHeartbeat] | None) -> Result:
    """Report an invalid pool; its children are left exactly as they are."""
    name, namespace = body.metadata.name or "", body.metadata.namespace or "default"
    deployment = await _deployment(context, namespace, name)
    problem = statuses.Problem("InvalidSpec", message)
    observed = _observed(body, name, _replicas(deployment) or 0, deployment, beats, problem)
    return Result(None, observed, [])


async def _protect_streams(
    context: Context, pool: pools.Pool, current: int | None,
    beats: list[registry.PodHeartbeat] | None,
) -> int:
    """Before fewer pods are asked for, mark each pod with its live slot use, so the
    ReplicaSet controller removes idle pods first. Returns how many pods were marked."""
    if current is None or pool.pods >= current:
        return 0
    if beats is None:
        raise kopf.TemporaryError(
            f"cannot read live slot use from Redis ({context.config.redis_url_shown}); not lowering"
            f" server pods from {current} to {pool.pods} until it can", delay=REDIS_RETRY_SECONDS)
    pods = await context.kube.list(kube.PODS, pool.namespace, naming.selector(pool.name))
    changes = usage.cost_changes(pods, usage.deletion_costs(pods, beats))
    marked = 0
    for pod_name, cost in changes.items():
        try:
            await context.kube.patch(kube.PODS, pool.namespace, pod_name, _cost_patch(cost))
        except kube.KubeError as exc:
            if exc.status != 404:
                raise
            continue  # the pod went away during this pass: nothing to protect
        marked += 1
    return marked


def _name_conflict(actions: list[applying.Applied]) -> statuses.Problem | None:
    refused = [applying.describe(applied.child) for applied in actions
               if applied.action is applying.Action.REFUSED]
    if not refused:
        return None
    return statuses.Problem("NameConflict", f"{', '.join(refused)} already exist(s) and "
                            f"belong(s) to someone else (no {naming.MANAGED_BY_LABEL}="
                            f"{naming.MANAGER} label, or another controller): rename or "
                            "remove it, or rename the pool; it was left untouched")


def _apply_failed(actions: list[applying.Applied]) -> statuses.Problem | None:
    failed = [f"{applying.describe(applied.child)}: {applied.error}" for applied in actions
              if applied.action is applying.Action.FAILED]
    if not failed:
        return None
    return statuses.Problem("ApplyFailed", "the API server refused " + "; ".join(failed)
                            + " (for an immutable field, delete that object and the operator"
                            " recreates it; tried again at each resync)")


def _cost_patch(cost: int) -> dict[str, Any]:
    return {"metadata": {"annotations": {naming.DELETION_COST_ANNOTATION: str(cost)}}}


async def _deployment(context: Context, namespace: str, name: str) -> dict[str, Any] | None:
    return await context.kube.get(kube.DEPLOYMENTS, namespace, naming.deployment(name))


async def _read_beats(context: Context, pool_name: str) -> list[registry.PodHeartbeat] | None:
    """The pool's heartbeats, or None when Redis cannot be read."""
    try:
        return await usage.read_beats(context.redis, pool_name)
    except (redis.RedisError, OSError):
        return None


async def _ensure_redis_user(context: Context, pool: pools.Pool) -> statuses.Problem | None:
    """Under Redis ACLs (a password seed), create or restore the Redis user of the pool's
    namespace at every pass: a Redis that restarted without it has it again within one.
    Until it exists the pods cannot heartbeat, and the status says why."""
    if context.config.redis_password_seed is None:
        return None
    user = redis_acl.pod_user(pool.namespace)
    try:
        await redis_acl.ensure_pod_user(context.redis, pool.namespace,
                                        children.redis_password(pool, context.config))
    except (redis.RedisError, OSError) as exc:
        return statuses.Problem(
            "RedisUserMissing", f"cannot set the Redis user {user} of this namespace in"
            f" {context.config.redis_url_shown}: {exc} (the operator's Redis user needs ACL"
            " rights, on Redis 6.2 or later; without ACLs, leave ASRPOOL_REDIS_PASSWORD_SEED"
            " unset); its pods cannot heartbeat until it exists")
    return None


async def _publish_members(context: Context, pool: pools.Pool,
                           pods: list[dict[str, Any]]) -> None:
    """Tell the routers which pods are the pool's (a heartbeat alone is not enough), at
    every pass; between passes, membership republishes on each pod's change."""
    await context.published.publish(context.redis, pool.registry_name,
                                    lambda: usage.members(pods), always=True)


def _replicas(deployment: Mapping[str, Any] | None) -> int | None:
    if deployment is None:
        return None
    return int(deployment.get("spec", {}).get("replicas") or 0)


def _observed(
    body: kopf.Body, name: str, desired_pods: int, deployment: Mapping[str, Any] | None,
    beats: list[registry.PodHeartbeat] | None, problem: statuses.Problem | None = None,
) -> statuses.Observed:
    if problem is None and beats is None:
        problem = statuses.Problem("RegistryUnavailable", "cannot read live slot use from Redis")
    return statuses.Observed(
        pool_name=name,
        generation=body.metadata.get("generation"),
        desired_pods=desired_pods,
        deployment=deployment,
        slot_use=usage.summarise(beats) if beats is not None else None,
        problem=problem,
    )
