"""A kmock Kubernetes emulator made a little more like a real API server, and helpers
that play the cluster's controllers (Deployment, kubelet, garbage collector).

kmock keeps objects as plain JSON merged by patches. On top of that, :class:`Emulator`

- assigns ``uid``, ``creationTimestamp`` and a fresh ``resourceVersion`` on every write
  (kopf needs them) and bumps ``generation`` when a ``spec`` changes;
- admits pools only if they validate against the CRD's own schema (a 422 otherwise),
  so a status or spec the operator writes outside the schema fails the test;
- names objects created with ``generateName`` (kopf's events), as the server does;
- serves ``GET /api/v1/namespaces``, which kmock 0.8 cannot parse (it reads the
  plural as a namespace), so kopf's namespace discovery works unchanged.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import jsonschema
import kmock
from kmock._internal import dicts, parsing, rendering

from asrpool.operator import kube

POOLS = kmock.resource("asrpool.io", "v1alpha1", "streamingasrpools")
DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
SERVICES = kmock.resource("", "v1", "services")
CONFIG_MAPS = kmock.resource("", "v1", "configmaps")
SECRETS = kmock.resource("", "v1", "secrets")
DISRUPTION_BUDGETS = kmock.resource("policy", "v1", "poddisruptionbudgets")
NETWORK_POLICIES = kmock.resource("networking.k8s.io", "v1", "networkpolicies")
PODS = kmock.resource("", "v1", "pods")
EVENTS = kmock.resource("", "v1", "events")
NAMESPACES = kmock.resource("", "v1", "namespaces")
ALL_VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}
WRITES = {"POST", "PATCH", "PUT", "DELETE"}
NAMESPACE = "speech"  # where the tests put their pools

_original_parse_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    """kmock 0.8 reads ``/api/v1/namespaces`` as "namespace ''"; read it as the plural."""
    if path.strip("/").split("/") == ["api", "v1", "namespaces"]:
        return parsing.ParsedPath(group="", version="v1", plural="namespaces")
    return _original_parse_path(path)


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    pool_schema: Mapping[str, Any] | None = None
    _versions: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    # A resource whose requests take ``stall_seconds`` each, and a flag set by the first.
    stalled_resource: kmock.resource | None = None
    stall_seconds: float = 0.0
    stalled: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)

    def stall(self, resource: kmock.resource, seconds: float) -> None:
        """Every request for ``resource`` from now on takes ``seconds``: a pass in
        progress that a test can wait for (:attr:`stalled`)."""
        self.stalled_resource, self.stall_seconds = resource, seconds
        self.stalled.clear()

    async def _handle(self, request: rendering.Request) -> Any:
        if self.stalled_resource is not None and request.resource == self.stalled_resource:
            self.stalled.set()
            await asyncio.sleep(self.stall_seconds)
        if request.resource is not None and isinstance(request.data, dict):
            if _is_apply(request) and not self._current(request):
                # Server-side apply creates what is missing. kmock merges an apply like
                # any patch (no field ownership): the real control-plane tests check that
                # an apply removes what the pool no longer asks for.
                self._create_for_apply(request)
            self._stamp(request)
            if request.resource == POOLS and self.pool_schema is not None:
                self._admit(request)
        return await super()._handle(request)

    def _stamp(self, request: rendering.Request) -> None:
        meta = request.data.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(self._versions))
        if request.action == kmock.action.CREATE:
            if "name" not in meta and "generateName" in meta:
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta.setdefault("generation", 1)
        elif request.action == kmock.action.UPDATE and "spec" in request.data \
                and not request.subresource:
            before = self._current(request).get("metadata", {})
            meta["generation"] = before.get("generation", 1) + 1

    def _create_for_apply(self, request: rendering.Request) -> None:
        meta = {"uid": str(uuid.uuid4()), "creationTimestamp": _now(), "generation": 1,
                "namespace": request.namespace, "name": request.name}
        self.objects[request.resource, request.namespace, request.name or ""] = {
            "apiVersion": request.data.get("apiVersion"), "kind": request.data.get("kind"),
            "metadata": meta}

    def _current(self, request: rendering.Request) -> dict[str, Any]:
        if request.resource is None:
            return {}
        key = (request.resource, request.namespace, request.name or "")
        if key in self.objects and not self.objects[key].deleted:
            return copy.deepcopy(self.objects[key].raw)
        return {}

    def _admit(self, request: rendering.Request) -> None:
        if request.action == kmock.action.CREATE:
            candidate = request.data
        elif request.action == kmock.action.UPDATE:
            candidate = dict(dicts.patch_dict(self._current(request), request.data))
        else:
            return
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft7Validator(self.pool_schema).iter_errors(candidate))
        if error is not None:
            where = ".".join(str(part) for part in error.absolute_path)
            message = f"{where}: {error.message}"
            raise kmock.KubernetesError(status=422, reason="Invalid", message=message)


def _is_apply(request: rendering.Request) -> bool:
    content_type = {k.lower(): v for k, v in request.headers.items()}.get("content-type", "")
    return request.action == kmock.action.UPDATE and content_type.startswith(
        "application/apply-patch")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def declare_resources(emulator: Emulator) -> None:
    """What discovery shows: the pools (status and scale subresources) and what the
    operator reads and writes."""
    info = kmock.ResourceInfo
    emulator.resources[POOLS] = info(
        kind="StreamingASRPool", singular="streamingasrpool", namespaced=True,
        verbs=ALL_VERBS, shortnames={"asrpool"}, subresources={"status", "scale"})
    emulator.resources[NAMESPACES] = info(kind="Namespace", namespaced=False, verbs=ALL_VERBS)
    for resource, kind in [(DEPLOYMENTS, "Deployment"), (SERVICES, "Service"),
                           (CONFIG_MAPS, "ConfigMap"), (SECRETS, "Secret"),
                           (DISRUPTION_BUDGETS, "PodDisruptionBudget"),
                           (NETWORK_POLICIES, "NetworkPolicy"),
                           (PODS, "Pod"), (EVENTS, "Event")]:
        emulator.resources[resource] = info(kind=kind, namespaced=True, verbs=ALL_VERBS)


def add_namespace(emulator: Emulator, name: str) -> None:
    emulator.objects[NAMESPACES, None, name] = {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "uid": name}}


class Cluster:
    """The test's hands on the emulator: reads from memory, writes over HTTP (so the
    operator's watches see them), and the controllers a real cluster would run."""

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator

    @property
    def url(self) -> str:
        return str(self.emulator.url).rstrip("/")

    def get(self, resource: kmock.resource, namespace: str, name: str) -> dict[str, Any] | None:
        key = (resource, namespace, name)
        if key not in self.emulator.objects or self.emulator.objects[key].deleted:
            return None
        return copy.deepcopy(self.emulator.objects[key].raw)

    def all(self, resource: kmock.resource, namespace: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(obj.raw) for (res, ns, _), obj in self.emulator.objects.items()
                if res == resource and ns == namespace and not obj.deleted]

    async def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        path = kube.kind_of(body).path(body["metadata"]["namespace"])
        return await self._send("post", path, body)

    async def patch(self, kind: kube.Kind, namespace: str, name: str, body: Mapping[str, Any],
                    subresource: str = "") -> dict[str, Any]:
        return await self._send("patch", kind.path(namespace, name, subresource), body)

    async def delete(self, kind: kube.Kind, namespace: str, name: str) -> dict[str, Any]:
        return await self._send("delete", kind.path(namespace, name), None)

    async def _send(self, method: str, path: str, body: Mapping[str, Any] | None) -> Any:
        async with getattr(self.emulator, method)(path, json=body) as response:
            data = await response.json()
            assert response.status < 300, f"{method.upper()} {path}: {response.status} {data}"
            return data

    def mark(self) -> int:
        """A point in the request log; see :meth:`writes_since`."""
        return len(self.emulator)

    def requests_since(self, mark: int) -> list[rendering.Request]:
        return list(self.emulator[mark:])

    def writes_since(self, mark: int, resource: kmock.resource | None = None) -> list[Any]:
        return [r for r in self.requests_since(mark) if r.method in WRITES
                and r.resource != EVENTS and (resource is None or r.resource == resource)]

    def events(self, namespace: str, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.all(EVENTS, namespace) if e.get("reason") == reason]

    async def run_deployment(self, namespace: str, name: str, ready: bool = True) -> list[str]:
        """Play the Deployment controller and the kubelet: pods to match the replicas
        (idle pods first when fewer are wanted: lowest deletion cost), and the status."""
        deployment = self.get(DEPLOYMENTS, namespace, name)
        assert deployment is not None, f"no Deployment {namespace}/{name}"
        wanted = deployment["spec"]["replicas"]
        pods = self.pods_of(namespace, name)
        for pod in _by_deletion_cost(pods)[: max(0, len(pods) - wanted)]:
            await self.delete(kube.PODS, namespace, pod["metadata"]["name"])
        for index in range(len(pods), wanted):
            await self.create(_pod(deployment, index))
        count = wanted if ready else 0
        await self.patch(kube.DEPLOYMENTS, namespace, name, {"status": {
            "observedGeneration": deployment["metadata"]["generation"], "replicas": wanted,
            "updatedReplicas": wanted, "readyReplicas": count, "availableReplicas": count}},
            subresource="status")
        return [p["metadata"]["name"] for p in self.pods_of(namespace, name)]

    def pods_of(self, namespace: str, deployment_name: str) -> list[dict[str, Any]]:
        return sorted(
            (p for p in self.all(PODS, namespace)
             if p["metadata"].get("labels", {}).get("deployment") == deployment_name),
            key=lambda p: p["metadata"]["name"])

    async def collect_garbage(self, namespace: str) -> int:
        """Play the garbage collector: delete objects whose controller owner is gone."""
        uids = {obj["metadata"].get("uid") for obj in self.all(POOLS, namespace)}
        removed = 0
        for resource, kind in [(DEPLOYMENTS, kube.DEPLOYMENTS), (SERVICES, kube.SERVICES),
                               (CONFIG_MAPS, kube.CONFIG_MAPS),
                               (DISRUPTION_BUDGETS, kube.DISRUPTION_BUDGETS),
                               (NETWORK_POLICIES, kube.NETWORK_POLICIES)]:
            for obj in self.all(resource, namespace):
                owners = obj["metadata"].get("ownerReferences") or []
                if owners and not any(ref["uid"] in uids for ref in owners):
                    await self.delete(kind, namespace, obj["metadata"]["name"])
                    removed += 1
        return removed


def _pod(deployment: Mapping[str, Any], index: int) -> dict[str, Any]:
    template = deployment["spec"]["template"]
    name = f"{deployment['metadata']['name']}-{index}"
    labels = {**template["metadata"]["labels"], "deployment": deployment["metadata"]["name"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": deployment["metadata"]["namespace"], "labels": labels,
        "annotations": dict(template["metadata"].get("annotations") or {})},
        "spec": copy.deepcopy(template["spec"]), "status": {"podIP": f"10.0.0.{index + 1}"}}


def _by_deletion_cost(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def cost(pod: dict[str, Any]) -> int:
        annotations = pod["metadata"].get("annotations") or {}
        return int(annotations.get("controller.kubernetes.io/pod-deletion-cost", "0"))
    return sorted(pods, key=cost)
