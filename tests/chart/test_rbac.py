"""The RBAC the chart grants the operator is exactly what the operator needs.

Three views must agree: the chart's rules, ``crds/rbac/operator.yaml`` (the operator's
declared need), and the operator's code: the kinds and verbs it calls through its
Kubernetes client (read from the source), and every request the real operator makes
in a run against the emulated API server (create a pool, scale it down).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import Any

import pytest
import redis.asyncio as aioredis
from kopf.testing import KopfRunner

from asrpool.common import registry
from asrpool.operator import children, kube, pools, settings
from tests.chart import emulated, rendering
from tests.operator import emulator
from tests.operator.conftest import cluster, operator, operator_settings  # noqa: F401
from tests.support import redis_servers
from tests.support.polling import eventually

NAMESPACE = emulator.NAMESPACE
Grant = tuple[str, str, str]  # (API group, resource[/subresource], verb)
OPERATOR_DIR = rendering.ROOT / "operator"
ACCOUNT = "demo-asrpool-operator"


def grants(rules: Iterable[dict[str, Any]]) -> set[Grant]:
    return {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def declared() -> set[Grant]:
    role = rendering.one(rendering.load_yaml(rendering.ROOT / "crds/rbac/operator.yaml"),
                         "ClusterRole")
    return grants(role["rules"])


def bound_roles(manifests: list[rendering.Manifest], kind: str) -> dict[str, list[str]]:
    """Role name to the namespaces it is bound in for the operator ('*': cluster-wide)."""
    found: dict[str, list[str]] = {}
    for binding in rendering.find(manifests, kind):
        subjects = [(s["kind"], s["name"], s["namespace"]) for s in binding["subjects"]]
        assert subjects == [("ServiceAccount", ACCOUNT, rendering.NAMESPACE)]
        where = binding["metadata"].get("namespace", "*")
        found.setdefault(binding["roleRef"]["name"], []).append(where)
    return found


def chart_grants(manifests: list[rendering.Manifest]) -> dict[str, set[Grant]]:
    return {role["metadata"]["name"]: grants(role["rules"])
            for role in rendering.find(manifests, "ClusterRole")}


def test_the_chart_grants_exactly_the_declared_rules() -> None:
    roles = chart_grants(rendering.render())
    assert set().union(*roles.values()) == declared()
    assert all(verb != "*" and resource != "*" for _, resource, verb in declared())
    # Secrets: only by name (each pool's own pod token), never listed or watched.
    assert {verb for _, resource, verb in declared() if resource == "secrets"} == {
        "get", "create", "patch"}


def test_all_namespaces_binds_every_rule_cluster_wide() -> None:
    manifests = rendering.render({"operator": {"allNamespaces": True}})
    assert bound_roles(manifests, "ClusterRoleBinding") == {
        "demo-asrpool-operator": ["*"], "demo-asrpool-operator-discovery": ["*"]}
    assert rendering.find(manifests, "RoleBinding") == []
    operator_env = env_of(rendering.deployment(manifests, "operator"))
    assert operator_env["ASRPOOL_ALL_NAMESPACES"] == "true"


def test_namespaced_binds_the_pool_rules_only_where_pools_live() -> None:
    manifests = rendering.render({"operator": {"allNamespaces": False},
                                  "pools": {"namespaces": ["speech", "speech-eu"]}})
    namespaces = [rendering.NAMESPACE, "speech", "speech-eu"]
    assert bound_roles(manifests, "RoleBinding") == {"demo-asrpool-operator": namespaces}
    assert bound_roles(manifests, "ClusterRoleBinding") == {
        "demo-asrpool-operator-discovery": ["*"]}
    discovery = chart_grants(manifests)["demo-asrpool-operator-discovery"]
    assert {resource for _, resource, _ in discovery} == {"namespaces", "customresourcedefinitions"}
    operator_env = env_of(rendering.deployment(manifests, "operator"))
    assert operator_env["ASRPOOL_NAMESPACES"] == ",".join(namespaces)


def env_of(deployment: rendering.Manifest) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in rendering.container(deployment)["env"]}


def test_the_rules_cover_every_call_in_the_operators_source() -> None:
    """Each ``kube.Kube`` call: its verb on its kind (``kind`` in applying.py: every child)."""
    child_kinds = {(c["apiVersion"], c["kind"]) for c in children.build_all(
        pools.from_body({"metadata": {"name": "p", "namespace": "n"},
                         "spec": {"model": {"name": "tiny"}, "slots": 1}}),
        settings.OperatorSettings(all_namespaces=True))}
    calls = source_calls()
    assert calls, "found no Kubernetes calls in operator/*.py: has the client changed?"
    needed: set[Grant] = set()
    for target, verb in calls:
        kinds = [kube.kind_of({"apiVersion": v, "kind": k}) for v, k in child_kinds] \
            if target == "kind" else [getattr(kube, target)]
        for kind in kinds:
            group = kind.api_version.rpartition("/")[0]
            needed.add((group, kind.plural, verb))
    assert needed - declared() == set()


def source_calls() -> set[tuple[str, str]]:
    """(``kube.NAME`` or ``kind``, verb) of every ``.get/.list/.create/.patch(KIND, ...)``."""
    found: set[tuple[str, str]] = set()
    for path in OPERATOR_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in {"get", "list", "create", "patch"} and node.args):
                continue
            first = node.args[0]
            if (isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name)
                    and first.value.id == "kube" and first.attr.isupper()):
                found.add((first.attr, node.func.attr))
            elif isinstance(first, ast.Name) and first.id == "kind":
                found.add(("kind", node.func.attr))
    return found


VERBS = {"FETCH": "get", "LIST": "list", "WATCH": "watch", "CREATE": "create",
         "DELETE": "delete"}


# The operator's two clients: kopf's own, and the kubernetes client (asrpool.operator.kube);
# the test's own requests (playing kubectl and the controllers) carry aiohttp's agent.
OPERATOR_AGENTS = ("kopf/", "OpenAPI-Generator/")


def agent(request: Any) -> str:
    return str(request.headers.get("User-Agent", ""))


def request_grant(request: Any) -> Grant | None:
    """The RBAC verb on the resource that one API request needs (None: discovery)."""
    if request.resource is None or not request.resource.plural or request.action is None:
        return None
    verb = VERBS.get(request.action.value) or ("patch" if request.method == "PATCH" else "update")
    resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
    return (request.resource.group or "", resource, verb)


@pytest.mark.timeout(90)
async def test_every_request_of_the_real_operator_is_granted(
    cluster: emulator.Cluster, operator: KopfRunner,  # noqa: F811
    redis_server: redis_servers.RedisServer,
) -> None:
    """Create a pool, then scale it down with busy pods (deletion costs are written)."""
    pool = {"apiVersion": "asrpool.io/v1alpha1", "kind": "StreamingASRPool",
            "metadata": {"name": "stt", "namespace": NAMESPACE},
            "spec": {"model": {"name": "kyutai/stt-1b-en_fr"}, "slots": 16, "slotsPerPod": 8}}
    await emulated.retried(lambda: cluster.create(pool),
                           lambda: cluster.get(emulator.POOLS, NAMESPACE, "stt") is not None)
    await eventually(lambda: _children_built(cluster))
    pods = emulated.run_pods(cluster, NAMESPACE, "stt")
    await _beat(redis_server.url, pods)
    await emulated.retried(
        lambda: cluster.patch(kube.POOLS, NAMESPACE, "stt", {"spec": {"slots": 8}}))
    await eventually(lambda: _replicas(cluster) == 1 or _fail())
    await eventually(lambda: cluster.events(NAMESPACE, "Scaled")[0])

    requests = [r for r in cluster.requests_since(0) if agent(r).startswith(OPERATOR_AGENTS)]
    assert {agent(r).split("/")[0] for r in requests} == {"kopf", "OpenAPI-Generator"}
    used = {grant for r in requests if (grant := request_grant(r))}
    granted = set().union(*chart_grants(rendering.render()).values())
    assert used - granted == set()
    assert ("", "pods", "patch") in used  # the scale-down ran: deletion costs were written


def _children_built(found: emulator.Cluster) -> None:
    for resource, name in [(emulator.CONFIG_MAPS, "stt-config"), (emulator.DEPLOYMENTS, "stt"),
                           (emulator.SERVICES, "stt"), (emulator.DISRUPTION_BUDGETS, "stt")]:
        assert found.get(resource, NAMESPACE, name) is not None, f"no {name} yet"


def _replicas(found: emulator.Cluster) -> int | None:
    deployment = found.get(emulator.DEPLOYMENTS, NAMESPACE, "stt")
    return None if deployment is None else int(deployment["spec"]["replicas"])


def _fail() -> bool:
    raise AssertionError("not yet")


async def _beat(url: str, pods: list[str]) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        for pod in pods:
            await registry.write_heartbeat(client, registry.PodHeartbeat(
                pod, "stt", f"{pod}:8080", 8, 8, False, "m"), lease_ms=120_000)
    finally:
        await client.aclose()


def test_the_operator_is_namespaced_by_default() -> None:
    """Least privilege unless told otherwise: the pool rules (pods patched, Deployments
    created) bound in the release namespace only, and that namespace watched."""
    manifests = rendering.render()
    assert bound_roles(manifests, "RoleBinding") == {"demo-asrpool-operator": [rendering.NAMESPACE]}
    assert "demo-asrpool-operator" not in bound_roles(manifests, "ClusterRoleBinding")
    assert env_of(rendering.deployment(manifests, "operator"))["ASRPOOL_NAMESPACES"] == \
        rendering.NAMESPACE
