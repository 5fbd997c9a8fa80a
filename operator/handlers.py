"""The kopf handlers, registered into a registry built per run (no import-time side effects).

Handlers are thin: take the per-pool lock, run one reconcile pass, turn its result into
a status patch, events and kopf errors. A change to the spec (``kubectl apply``,
``kubectl scale``, an HPA, the built-in autoscaler) goes through the change handlers;
a timer repairs drift (a child deleted or edited by hand), refreshes the status and
autoscales. Between passes, the server pods' events keep each pool's member list (what
routers admit to) current (asrpool.operator.membership).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from typing import Any

import kopf

from asrpool.common import redis_clients
from asrpool.operator import (
    applying,
    autoscaling,
    kube,
    membership,
    naming,
    reconciling,
    scaling,
    settings,
    statuses,
)

POOL = (naming.GROUP, naming.VERSION, naming.PLURAL)
API_RETRY_SECONDS = 5
DELETION_POLLING_SECONDS = 1.0


def build_registry(config: settings.OperatorSettings) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    _register_lifecycle(registry, config)
    _register_pools(registry, config)
    _register_pods(registry)
    return registry


def configure(kopf_settings: kopf.OperatorSettings) -> None:
    """Keep kopf's bookkeeping in ``asrpool.io/`` annotations: the status schema is strict,
    only explicit events (not every log line) go to the pools, and a deleted pool is let
    go within a second of its running pass's end."""
    kopf_settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=naming.GROUP)
    kopf_settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=naming.GROUP, key="last-handled-configuration")
    kopf_settings.posting.level = logging.WARNING
    # A pool deleted while its resync pass runs keeps kopf's finalizer until the pass
    # returns, and kopf looks again only after this many seconds (60 by default).
    kopf_settings.background.cancellation_polling = DELETION_POLLING_SECONDS


def _register_lifecycle(registry: kopf.OperatorRegistry, config: settings.OperatorSettings) -> None:
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """A plain URL when one is set, else the kubernetes client's own credentials
        (in-cluster, else kubeconfig): a plain registry has no login handlers of its own."""
        if config.kube_api_url:
            return kopf.ConnectionInfo(server=str(config.kube_api_url))
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        configure(settings)
        api = kube.Kube(kube.load_configuration(config.kube_api_url))
        redis = redis_clients.connect(config.redis_url, config.redis_timeout_seconds,
                                      password=config.redis_password_value())
        memo.context = reconciling.Context(config, api, redis)

    @kopf.on.cleanup(registry=registry)
    async def stop(memo: kopf.Memo, **_: Any) -> None:
        context: reconciling.Context = memo.context
        await context.redis.aclose()
        context.kube.close()


def _register_pools(registry: kopf.OperatorRegistry, config: settings.OperatorSettings) -> None:
    @kopf.on.resume(*POOL, id="reconcile", registry=registry)
    @kopf.on.create(*POOL, id="reconcile", registry=registry)
    @kopf.on.update(*POOL, id="reconcile", field="spec", registry=registry)
    async def reconcile_pool(body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, **_: Any) -> None:
        result = await _pass(memo, body)
        _report(body, patch, result)
        if result.invalid:
            raise kopf.PermanentError(f"invalid pool: {result.invalid}")

    @kopf.timer(*POOL, id="resync", interval=config.resync_seconds,
                initial_delay=config.resync_seconds, registry=registry)
    async def resync_pool(body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, **_: Any) -> None:
        result = await _pass(memo, body)
        _report(body, patch, result)
        await _autoscale(body, memo, patch, result)


def _register_pods(registry: kopf.OperatorRegistry) -> None:
    """A pool's member list follows its pods between passes (asrpool.operator.membership)."""

    @kopf.index("v1", "pods", id=membership.INDEX, labels=membership.SERVER_PODS,
                registry=registry)
    def server_pod_ips(namespace: str | None, name: str, labels: kopf.Labels,
                       status: kopf.Status, **_: Any,
                       ) -> dict[membership.PoolKey, tuple[str, str]]:
        return membership.index_entry(namespace or "", name, labels, status)

    @kopf.on.event("v1", "pods", id="server_pod_changed", labels=membership.SERVER_PODS,
                   registry=registry)
    async def server_pod_changed(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo,
                                 **kwargs: Any) -> None:
        context: reconciling.Context = memo.context
        index: kopf.Index[membership.PoolKey, Any] = kwargs[membership.INDEX]  # by its id
        key = (namespace or "", labels[naming.POOL_LABEL])
        await context.published.publish(context.redis, naming.registry_name(*key),
                                        lambda: membership.pool_members(index, key))


async def _pass(memo: kopf.Memo, body: kopf.Body) -> reconciling.Result:
    """One reconcile pass; passes over one pool never overlap (per-pool lock in its memo)."""
    lock: asyncio.Lock = memo.setdefault("lock", asyncio.Lock())
    async with lock:
        try:
            return await reconciling.reconcile(memo.context, body)
        except kube.KubeError as exc:
            raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=API_RETRY_SECONDS) from exc


def _report(body: kopf.Body, patch: kopf.Patch, result: reconciling.Result) -> None:
    previous = dict(body.get("status") or {})
    status = statuses.build(result.observed, previous, _now())
    if statuses.changed(previous, status):
        patch.status.update(status)
    _post_events(body, result, previous)


def _post_events(body: kopf.Body, result: reconciling.Result, previous: dict[str, Any]) -> None:
    for child, action, _ in result.actions:
        if action in (applying.Action.CREATED, applying.Action.UPDATED):
            message = f"{action.value} {applying.describe(child)}"
            kopf.event(body, type="Normal", reason=action.value, message=message)
    if result.scaled_from is not None and result.pool is not None:
        message = (f"server pods {result.scaled_from} -> {result.pool.pods} for"
                   f" {result.pool.slots} slots")
        if result.costs_set:
            message += f"; deletion cost set on {result.costs_set} pods from live slot use"
        kopf.event(body, type="Normal", reason="Scaled", message=message)
    problem = result.observed.problem
    if problem is not None and problem.message != _degraded_message(previous):
        # Once per new problem, not once per retry: the status carries it meanwhile.
        kopf.event(body, type="Warning", reason=problem.reason, message=problem.message)


def _degraded_message(status: dict[str, Any]) -> str | None:
    found = [c for c in status.get("conditions") or [] if c.get("type") == "Degraded"]
    return found[0].get("message") if found else None


async def _autoscale(
    body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, result: reconciling.Result
) -> None:
    """Move ``spec.slots`` toward the demand; the change handler then scales the pods.
    A fresh memory is seeded from spec.slots, so a restart never scales down at once."""
    pool, slot_use = result.pool, result.observed.slot_use
    previous = (body.get("status") or {}).get("autoscaling") or {}
    if pool is not None and not pool.autoscaling.enabled:
        if previous:
            patch.status["autoscaling"] = None  # off: no stale report
        memo.pop("autoscaling", None)  # turned on again later: seeded afresh
        return
    if pool is None or slot_use is None:
        return
    context: reconciling.Context = memo.context
    demand = await scaling.read_demand(context.redis, pool, slot_use, context.config.resync_seconds)
    if demand is None:
        return
    now = time.monotonic()
    state = memo.get("autoscaling") or autoscaling.seeded(now, pool.slots)
    memo.autoscaling, decision = autoscaling.step(state, demand, now, pool.slots, pool)
    scaled = decision.slots != pool.slots
    if scaled:
        patch.spec["slots"] = decision.slots
        kopf.event(body, type="Normal", reason="Autoscaled",
                   message=scaling.message(pool.slots, decision, demand, pool))
    report = scaling.status(decision, demand, _now() if scaled else None, previous)
    if report != previous:
        patch.status["autoscaling"] = report


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
