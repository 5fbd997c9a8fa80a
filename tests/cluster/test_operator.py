"""The CRD and the operator against the real control plane.

What only a real API server shows: it applies the CRD's defaults, its structural schema
and CEL rules; ``kubectl scale`` goes through the scale subresource to ``spec.slots``; the
status subresource takes the operator's status; the printer columns render in ``kubectl
get``; and the garbage collector removes a deleted pool's children. The operator runs in
the test process here (kopf with the admin kubeconfig); the chart tests run it as a pod
under its own service account.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import kubernetes
import pytest
import redis
import yaml
from kopf.testing import KopfRunner

from asrpool.common import processes, registry, waiting
from asrpool.operator import handlers, naming, settings
from tests.cluster.clusters import Cluster
from tests.operator import schemas
from tests.support import redis_servers
from tests.support.polling import eventually

pytestmark = pytest.mark.timeout(300)
TIMEOUT = 90.0


@pytest.fixture
def kubeconfig(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # kopf's login and the operator's client read the kubeconfig's default path, which
    # the kubernetes package took from KUBECONFIG when it was imported.
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION",
                        str(cluster.kubeconfig))


@contextlib.asynccontextmanager
async def running(namespace: str, redis_url: str,
                  resync_seconds: float = 2.0) -> AsyncIterator[KopfRunner]:
    """One operator process's life, in a thread of the test process."""
    config = settings.OperatorSettings(namespaces=[namespace], redis_url=redis_url,
                                       resync_seconds=resync_seconds)
    runner = KopfRunner(["run", "--standalone", "--namespace", namespace],
                        registry=handlers.build_registry(config), settings=kopf.OperatorSettings(),
                        timeout=60)
    await asyncio.to_thread(runner.__enter__)
    try:
        yield runner
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)


@pytest.fixture
async def operator(kubeconfig: None, namespace: str, redis_server: redis_servers.RedisServer
                   ) -> AsyncIterator[KopfRunner]:
    async with running(namespace, redis_server.url) as runner:
        yield runner


def pools(cluster: Cluster) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(cluster.api)


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{naming.GROUP}/{naming.VERSION}", "kind": naming.KIND,
            "metadata": {"name": name},
            "spec": {"model": {"name": "kyutai/stt-1b-en_fr"}, "slots": 16, **spec}}


def create(cluster: Cluster, namespace: str, body: dict[str, Any]) -> Any:
    return pools(cluster).create_namespaced_custom_object(
        naming.GROUP, naming.VERSION, namespace, naming.PLURAL, body)


def test_the_api_server_fills_in_the_crds_defaults(crd: None, cluster: Cluster,
                                                   namespace: str) -> None:
    created = create(cluster, namespace, manifest("defaults"))
    assert created["spec"]["slotsPerPod"] == 8
    assert created["spec"]["resources"] == {"gpus": 1, "gpuResourceName": "nvidia.com/gpu"}


@pytest.mark.parametrize("path", schemas.BAD_POOLS, ids=lambda path: path.stem)
def test_the_api_server_refuses_each_bad_pool_with_the_schemas_message(
    crd: None, cluster: Cluster, namespace: str, path: Any
) -> None:
    body = yaml.safe_load(path.read_text())
    result = cluster.kubectl("apply", "--namespace", namespace, "-f", str(path), check=False)
    assert result.returncode != 0, f"{path.name} was admitted"
    assert "is invalid" in result.stderr or "unknown field" in result.stderr, result.stderr
    listed = pools(cluster).list_namespaced_custom_object(
        naming.GROUP, naming.VERSION, namespace, naming.PLURAL)
    assert body["metadata"]["name"] not in [item["metadata"]["name"] for item in listed["items"]]


def test_every_shipped_example_is_admitted(crd: None, cluster: Cluster, namespace: str) -> None:
    for path in schemas.EXAMPLES:
        body = yaml.safe_load(path.read_text())
        body["metadata"].pop("namespace", None)
        cluster.kubectl("apply", "--dry-run=server", "--namespace", namespace, "-f", "-",
                        stdin=json.dumps(body))


async def test_kubectl_scale_status_columns_and_garbage_collection(
    crd: None, cluster: Cluster, namespace: str, operator: KopfRunner
) -> None:
    create(cluster, namespace, manifest("stt"))
    apps = kubernetes.client.AppsV1Api(cluster.api)

    def replicas() -> int:
        try:
            return int(apps.read_namespaced_deployment("stt", namespace).spec.replicas)
        except kubernetes.client.ApiException as exc:
            raise AssertionError(f"no Deployment yet: {exc.status}") from exc

    assert await eventually(replicas, TIMEOUT, period=0.5) == 2
    cluster.kubectl("scale", "--namespace", namespace, "asrpool/stt", "--replicas=24")
    assert cluster.get(namespace, "asrpool", "stt")["spec"]["slots"] == 24

    def scaled() -> None:
        assert replicas() == 3

    await eventually(scaled, TIMEOUT, period=0.5)

    def status_written() -> dict[str, Any]:
        pool = cluster.get(namespace, "asrpool", "stt")
        status = pool["status"]
        assert status["observedGeneration"] == pool["metadata"]["generation"]
        return dict(status)

    status = await eventually(status_written, TIMEOUT, period=0.5)
    assert {c["type"] for c in status["conditions"]} >= {"Ready", "Progressing", "Degraded"}
    scale = json.loads(cluster.kubectl("get", "--raw", f"/apis/{naming.GROUP}/{naming.VERSION}"
                                       f"/namespaces/{namespace}/{naming.PLURAL}/stt/scale").stdout)
    assert scale["spec"]["replicas"] == 24
    header = cluster.kubectl("get", "asrpool", "--namespace", namespace).stdout.splitlines()[0]
    assert header.split()[:1] == ["NAME"]
    assert {"SLOTS", "FREE", "READY", "AGE"} <= set(header.split())
    cluster.kubectl("delete", "--namespace", namespace, "asrpool/stt", "--wait=true")

    def collected() -> None:
        assert apps.list_namespaced_deployment(namespace).items == []
        core = kubernetes.client.CoreV1Api(cluster.api)
        assert core.list_namespaced_config_map(
            namespace, label_selector=f"{naming.POOL_LABEL}=stt").items == []

    await eventually(collected, TIMEOUT, period=0.5)


async def test_a_field_removed_from_the_pool_is_removed_from_its_deployment(
    crd: None, cluster: Cluster, namespace: str, operator: KopfRunner
) -> None:
    create(cluster, namespace, manifest("placed", nodeSelector={"gpu": "h100"},
                                        tolerations=[{"key": "gpu", "operator": "Exists"}]))
    apps = kubernetes.client.AppsV1Api(cluster.api)

    def placement() -> tuple[dict[str, str], int]:
        try:
            spec = apps.read_namespaced_deployment("placed", namespace).spec.template.spec
        except kubernetes.client.ApiException as exc:
            raise AssertionError(f"no Deployment yet: {exc.status}") from exc
        return dict(spec.node_selector or {}), len(spec.tolerations or [])

    assert await eventually(placement, TIMEOUT, period=0.5) == ({"gpu": "h100"}, 1)
    pools(cluster).patch_namespaced_custom_object(
        naming.GROUP, naming.VERSION, namespace, naming.PLURAL, "placed",
        {"spec": {"nodeSelector": {"gpu": None, "accel": "a100"}, "tolerations": None}})

    def moved() -> None:
        assert placement() == ({"accel": "a100"}, 0)  # not both selectors: pods can schedule

    await eventually(moved, TIMEOUT, period=0.5)
    shown = cluster.kubectl("get", "deployment", "placed", "-n", namespace, "-o", "json",
                            "--show-managed-fields")
    fields = json.loads(shown.stdout)["metadata"]["managedFields"]
    assert {(entry["manager"], entry["operation"]) for entry in fields} >= {
        (naming.MANAGER, "Apply")}


def degraded(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    status = cluster.get(namespace, "asrpool", name).get("status") or {}
    found = [c for c in status.get("conditions", []) if c["type"] == "Degraded"]
    assert found and found[0]["status"] == "True", found
    return dict(found[0])


def warnings_about(cluster: Cluster, namespace: str, name: str) -> list[str]:
    events = kubernetes.client.CoreV1Api(cluster.api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},type=Warning").items
    return [event.reason for event in events]


async def test_pods_the_scheduler_cannot_place_degrade_the_pool_with_its_verdict(
    crd: None, cluster: Cluster, namespace: str, operator: KopfRunner
) -> None:
    # Each node has 2 GPUs: a pod asking for 4 fits nowhere.
    create(cluster, namespace, manifest("greedy", slots=8, resources={"gpus": 4}))
    condition = await eventually(lambda: degraded(cluster, namespace, "greedy"), TIMEOUT,
                                 period=0.5)
    assert condition["reason"] == "PodsUnschedulable"
    assert "Insufficient nvidia.com/gpu" in condition["message"]
    reasons = await eventually(lambda: checks_one(warnings_about(cluster, namespace, "greedy"),
                                                  "PodsUnschedulable"), TIMEOUT, period=0.5)
    assert reasons.count("PodsUnschedulable") == 1  # one event, not one per pass


async def test_a_volume_without_the_checkpoint_degrades_the_pool_naming_the_missing_file(
    crd: None, cluster: Cluster, namespace: str, operator: KopfRunner, tmp_path: Path
) -> None:
    """The server exits 3 with its reason as its last line; the kubelet keeps both
    (``FallbackToLogsOnError``) and the pool shows them, once."""
    (tmp_path / "empty").mkdir()
    create(cluster, namespace, manifest("hollow", slots=1, slotsPerPod=1, resources={"gpus": 0},
                                        model={"volume": {"hostPath": str(tmp_path),
                                                          "subPath": "empty"}}))

    def model_unavailable() -> dict[str, Any]:
        condition = degraded(cluster, namespace, "hollow")
        assert condition["reason"] == "ModelUnavailable", condition
        return condition

    condition = await eventually(model_unavailable, 180.0, period=1.0)
    assert condition["message"].startswith("container server: asrpool serve: checkpoint")
    assert condition["message"].endswith("is missing config.json")
    assert warnings_about(cluster, namespace, "hollow").count("ModelUnavailable") == 1


async def test_an_unreachable_model_registry_degrades_the_pool_without_a_storm(
    crd: None, cluster: Cluster, namespace: str, operator: KopfRunner
) -> None:
    """The fetch-model init container fails (exit 4) and restarts with back-off; the pool
    is Degraded RegistryUnavailable with its message; one pod, one Warning event."""
    create(cluster, namespace, manifest(
        "offline", slots=1, slotsPerPod=1, resources={"gpus": 0},
        env=[{"name": "HF_ENDPOINT", "value": "http://127.0.0.1:9"}]))  # nothing listens

    def registry_unavailable() -> dict[str, Any]:
        condition = degraded(cluster, namespace, "offline")
        assert condition["reason"] == "RegistryUnavailable", condition
        return condition

    condition = await eventually(registry_unavailable, 180.0, period=1.0)
    assert condition["message"] == (
        "container fetch-model: asrpool fetch-model: cannot reach the Hugging Face Hub at"
        " http://127.0.0.1:9 to fetch kyutai/stt-1b-en_fr, and the cache does not hold it")

    def failed_twice_with_a_back_off() -> dict[str, Any]:
        (pod,) = kubernetes.client.CoreV1Api(cluster.api).list_namespaced_pod(
            namespace, label_selector=f"{naming.POOL_LABEL}=offline").items
        (fetch,) = pod.status.init_container_statuses
        assert fetch.restart_count >= 1, fetch.restart_count  # each try: 23 s of Hub retries
        assert fetch.state.waiting and fetch.state.waiting.reason == "CrashLoopBackOff", fetch
        return {"fetch": fetch, "server": pod.status.container_statuses[0]}

    statuses = await eventually(failed_twice_with_a_back_off, 180.0, period=1.0)
    assert "back-off" in statuses["fetch"].state.waiting.message
    assert statuses["fetch"].last_state.terminated.exit_code == 4
    assert statuses["server"].restart_count == 0  # never started: no model, no server
    assert warnings_about(cluster, namespace, "offline").count("RegistryUnavailable") == 1


def checks_one(reasons: list[str], reason: str) -> list[str]:
    assert reason in reasons, reasons
    return reasons


async def test_a_same_named_object_of_someone_else_is_never_taken_over(
    crd: None, cluster: Cluster, namespace: str, operator: KopfRunner
) -> None:
    theirs = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "clash-config"},
              "data": {"owner": "another team"}}
    cluster.apply(namespace, theirs)
    create(cluster, namespace, manifest("clash"))
    condition = await eventually(lambda: degraded(cluster, namespace, "clash"), TIMEOUT,
                                 period=0.5)
    assert condition["reason"] == "NameConflict"
    assert f"ConfigMap {namespace}/clash-config" in condition["message"]
    kept = cluster.get(namespace, "configmap", "clash-config")
    assert kept["data"] == {"owner": "another team"}
    assert "ownerReferences" not in kept["metadata"]
    apps = kubernetes.client.AppsV1Api(cluster.api)
    assert apps.list_namespaced_deployment(namespace).items == []  # nothing reads it


async def test_a_restarted_operator_does_not_scale_a_pool_down_by_itself(
    crd: None, cluster: Cluster, namespace: str, kubeconfig: None,
    redis_server: redis_servers.RedisServer,
) -> None:
    """No streams and a 300 s scale-down window: neither the first operator nor the one
    started after it lowers spec.slots, though both recommend 8 (no pod runs: each asks
    for more GPUs than a node has)."""
    create(cluster, namespace, manifest("steady", slots=32, resources={"gpus": 4},
                                        autoscaling={"enabled": True, "maxSlots": 64}))

    def autoscaled(refused: bool) -> dict[str, Any]:
        pool = cluster.get(namespace, "asrpool", "steady")
        report = (pool.get("status") or {}).get("autoscaling") or {}
        seen = report.get("refusedClients")
        assert seen is not None and (seen > 0) == refused, report
        assert pool["spec"]["slots"] == 32, pool["spec"]
        return dict(report)

    client = redis.Redis.from_url(redis_server.url)

    def refused_now() -> dict[str, Any]:
        """A client refused just now (as a router records it), until a pass sees one."""
        seconds, micros = client.time()
        client.zadd(waiting.refusals_key(f"{namespace}/steady"),  # as routers key it
                    {uuid.uuid4().hex: seconds * 1000 + micros // 1000})
        return autoscaled(refused=True)

    async with running(namespace, redis_server.url):
        report = await eventually(lambda: autoscaled(refused=False), TIMEOUT, period=0.5)
    assert (report["recommendedSlots"], report["desiredSlots"]) == (8, 32)
    assert report["limitedBy"] == "ScaleDownStabilization"
    async with running(namespace, redis_server.url):
        # The new operator's passes: it sees refusals, then sees them age out.
        await eventually(refused_now, TIMEOUT, period=0.5)
        report = await eventually(lambda: autoscaled(refused=False), TIMEOUT, period=0.5)
    client.close()
    assert report["limitedBy"] == "ScaleDownStabilization"
    apps = kubernetes.client.AppsV1Api(cluster.api)
    assert apps.read_namespaced_deployment("steady", namespace).spec.replicas == 4


async def test_pods_join_the_member_list_as_they_get_their_ip_not_at_a_pass(
    crd: None, cluster: Cluster, namespace: str, kubeconfig: None,
    redis_server: redis_servers.RedisServer,
) -> None:
    """Passes an hour apart: the pods the real ReplicaSet controller makes, placed by the
    real scheduler and given an IP by the node agent, reach the routers' member list
    through the operator's pod watch; a deleted pod leaves it and its replacement joins."""
    create(cluster, namespace, manifest("listed", slots=16, slotsPerPod=8))
    core = kubernetes.client.CoreV1Api(cluster.api)
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    key = registry.pool_members_key(f"{namespace}/listed")

    def listed(count: int) -> dict[str, str]:
        pods = core.list_namespaced_pod(namespace, label_selector=naming.selector_text(
            "listed")).items
        ips = {pod.metadata.name: pod.status.pod_ip for pod in pods
               if pod.status.pod_ip and pod.metadata.deletion_timestamp is None}
        assert len(ips) == count, ips
        members = client.hgetall(key)  # by pod id, as the pods heartbeat
        assert {n: ip for n, ip in members.items() if n != registry.MEMBERS_SENTINEL} == {
            naming.pod_id(namespace, name): ip for name, ip in ips.items()}
        return ips

    async with running(namespace, redis_server.url, resync_seconds=3600.0):
        first = await eventually(lambda: listed(2), TIMEOUT, period=0.5)
        gone = sorted(first)[0]
        core.delete_namespaced_pod(gone, namespace, grace_period_seconds=0)

        def replaced() -> dict[str, str]:
            now = listed(2)
            assert gone not in now, now
            return now

        await eventually(replaced, TIMEOUT, period=0.5)
    client.close()


async def test_an_immutable_field_is_reported_once_not_retried_in_a_loop(
    crd: None, cluster: Cluster, namespace: str, operator: KopfRunner
) -> None:
    """A Service of ours from before (our label, a cluster IP): the headless one cannot
    replace it in place. The pool says so with the API server's words, one event, and
    its other children are applied."""
    ours = {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "frozen", "labels": {naming.MANAGED_BY_LABEL: naming.MANAGER}},
        "spec": {"ports": [{"name": "http", "port": 8080}]}}
    cluster.apply(namespace, ours)
    create(cluster, namespace, manifest("frozen", resources={"gpus": 4}))
    condition = await eventually(lambda: degraded(cluster, namespace, "frozen"), TIMEOUT,
                                 period=0.5)
    assert condition["reason"] == "ApplyFailed", condition
    assert f"Service {namespace}/frozen" in condition["message"]
    assert "immutable" in condition["message"] or "may not change" in condition["message"]
    apps = kubernetes.client.AppsV1Api(cluster.api)
    assert apps.read_namespaced_deployment("frozen", namespace).spec.replicas == 2
    await asyncio.sleep(6.0)  # three resyncs of 2 s: each tries again, none posts again
    assert warnings_about(cluster, namespace, "frozen").count("ApplyFailed") == 1


PEERING_CRDS = Path(__file__).resolve().parents[2] / "crds" / "kopf-peering.yaml"


@pytest.fixture(scope="session")
def peering_crds(cluster: Cluster) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(PEERING_CRDS))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/kopfpeerings.kopf.dev")


def replica(name: str, priority: int, cluster: Cluster, namespace: str, redis_url: str,
            workdir: Path) -> processes.Child:
    """``asrpool operator --peering`` as its own process, as a pod of the chart runs it."""
    argv = [sys.executable, "-m", "asrpool.cli", "operator", "--namespace", namespace,
            "--redis-url", redis_url, "--resync-seconds", "2", "--peering", "asrpool",
            "--priority", str(priority)]
    return processes.spawn(name, argv, workdir / f"{name}.log",
                           env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})


def peers(cluster: Cluster, namespace: str, count: int) -> None:
    status = cluster.get(namespace, "kopfpeering", "asrpool").get("status") or {}
    assert len(status) == count, status


def acted(child: processes.Child) -> int:
    return child.log.read_text(errors="replace").count("Handler 'reconcile' succeeded")


async def test_two_operator_replicas_never_fight(
    crd: None, peering_crds: None, cluster: Cluster, namespace: str,
    redis_server: redis_servers.RedisServer, tmp_path: Path,
) -> None:
    """Two processes share one KopfPeering: the one of higher priority acts alone; when it
    stops, the other resumes and acts on the next change."""
    cluster.apply(namespace, {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                              "metadata": {"name": "asrpool"}})
    first = replica("first", 200, cluster, namespace, redis_server.url, tmp_path)
    second: processes.Child | None = None
    try:
        await eventually(lambda: peers(cluster, namespace, 1), TIMEOUT, period=0.5)
        second = replica("second", 100, cluster, namespace, redis_server.url, tmp_path)
        await eventually(lambda: peers(cluster, namespace, 2), TIMEOUT, period=0.5)
        create(cluster, namespace, manifest("shared", resources={"gpus": 4}))
        apps = kubernetes.client.AppsV1Api(cluster.api)

        def replicas(wanted: int) -> None:
            try:
                deployment = apps.read_namespaced_deployment("shared", namespace)
            except kubernetes.client.ApiException as exc:
                raise AssertionError(f"no Deployment yet: {exc.status}") from exc
            assert deployment.spec.replicas == wanted

        await eventually(lambda: replicas(2), TIMEOUT, period=0.5)
        assert acted(first) >= 1
        assert acted(second) == 0  # paused: the first, of higher priority, acts
        first.stop(timeout=30)
        await eventually(lambda: peers(cluster, namespace, 1), TIMEOUT, period=0.5)
        cluster.kubectl("scale", "--namespace", namespace, "asrpool/shared", "--replicas=24")
        await eventually(lambda: replicas(3), TIMEOUT, period=0.5)
        assert acted(second) >= 1
    finally:
        for child in (first, second):
            if child is not None:
                child.stop(timeout=30)


def test_the_hpa_example_passes_a_server_side_dry_run(crd: None, cluster: Cluster,
                                                      namespace: str) -> None:
    """The real API server validates docs/examples/hpa.yaml (autoscaling/v2, behavior)."""
    path = Path(__file__).resolve().parents[2] / "docs" / "examples" / "hpa.yaml"
    result = cluster.kubectl("apply", "--dry-run=server", "--namespace", namespace,
                             "-f", str(path), check=False)
    assert result.returncode == 0, result.stderr
    assert "created (server dry run)" in result.stdout
