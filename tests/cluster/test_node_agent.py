"""The local node agent against the real control plane: what a kubelet would do.

Every pod here is created through the real API server and placed by the real scheduler
(and, for Deployments, the real ReplicaSet controller); the agent runs it as processes.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.cluster.clusters import Cluster
from tests.support.polling import eventually

pytestmark = pytest.mark.timeout(240)
TIMEOUT = 60.0


def pod(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "none", "command": command,
                 **spec.pop("container", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 5, **spec}}


def container_state(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    status = cluster.get(namespace, "pod", name)["status"]
    statuses = status.get("containerStatuses") or [{}]
    return dict(statuses[0])


def test_nodes_are_ready_with_gpus(cluster: Cluster) -> None:
    nodes = kubernetes.client.CoreV1Api(cluster.api).list_node().items
    assert len(nodes) == 2
    for node in nodes:
        assert node.status.allocatable["nvidia.com/gpu"] == "2"
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready[0].status == "True"


async def test_a_deployment_serves_on_its_pod_address_with_its_environment(
    cluster: Cluster, namespace: str
) -> None:
    script = ('printf "%s %s" "$GREETING" "$WORD" > index.html && '
              "exec python3 -m http.server 8000 --bind 0.0.0.0")
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
              "data": {"GREETING": "hello"}}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sec"},
              "stringData": {"word": "world"}}
    template = pod("web", ["sh", "-c", script], container={
        "envFrom": [{"configMapRef": {"name": "cfg"}}],
        "env": [{"name": "WORD", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "word"}}}],
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}})
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                  "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                           "template": {"metadata": {"labels": {"app": "web"}},
                                        "spec": template["spec"]}}}
    cluster.apply(namespace, [config, secret, deployment])

    def available() -> list[str]:
        status = cluster.get(namespace, "deployment", "web")["status"]
        assert status.get("availableReplicas") == 2
        pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)
        return [item["status"]["podIP"] for item in pods["items"]]

    addresses = await eventually(available, TIMEOUT, period=0.5)
    assert len(set(addresses)) == 2 and all(a.startswith("127.0.") for a in addresses)
    for address in addresses:
        with urllib.request.urlopen(f"http://{address}:8000/index.html", timeout=5) as answer:
            assert answer.read() == b"hello world"


async def test_deletion_sends_sigterm_then_sigkill_after_the_grace_period(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    script = f"trap 'echo term > {tmp_path}/signal' TERM; while true; do sleep 0.1; done"
    cluster.apply(namespace, pod("stubborn", ["sh", "-c", script],
                                 terminationGracePeriodSeconds=3))
    await eventually(lambda: container_state(cluster, namespace, "stubborn")["state"]["running"],
                     TIMEOUT, period=0.5)
    started = time.monotonic()
    cluster.kubectl("delete", "pod", "stubborn", "-n", namespace, "--wait=true")
    elapsed = time.monotonic() - started
    assert (tmp_path / "signal").read_text().strip() == "term"  # SIGTERM came first
    assert elapsed >= 2.5  # it ignored SIGTERM: the pod stayed for its grace period


async def test_containers_that_cannot_run_report_why(cluster: Cluster, namespace: str) -> None:
    cluster.apply(namespace, [
        pod("missing-command", ["no-such-program"]),
        pod("crashing", ["sh", "-c", "exit 3"]),
        pod("missing-config", ["sleep", "60"],
            container={"envFrom": [{"configMapRef": {"name": "absent"}}]}),
    ])

    def reasons() -> None:
        missing = container_state(cluster, namespace, "missing-command")["state"]["waiting"]
        assert missing["reason"] == "RunContainerError"
        assert "executable file not found" in missing["message"]
        crashing = container_state(cluster, namespace, "crashing")
        assert crashing["restartCount"] >= 1
        assert crashing["lastState"]["terminated"]["exitCode"] == 3
        config = container_state(cluster, namespace, "missing-config")["state"]["waiting"]
        assert config == {"reason": "CreateContainerConfigError",
                          "message": 'configmap "absent" not found'}

    await eventually(reasons, TIMEOUT, period=0.5)


async def test_a_failing_liveness_probe_restarts_the_container(
    cluster: Cluster, namespace: str
) -> None:
    probe = {"exec": {"command": ["false"]}, "periodSeconds": 1, "failureThreshold": 2}
    cluster.apply(namespace, pod("unhealthy", ["sleep", "600"],
                                 container={"livenessProbe": probe}))

    def restarted() -> None:
        assert container_state(cluster, namespace, "unhealthy")["restartCount"] >= 1

    await eventually(restarted, TIMEOUT, period=0.5)


async def test_pods_get_their_service_accounts_token_and_rbac_applies(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    script = (
        "import kubernetes, sys\n"
        "kubernetes.config.load_kube_config()\n"
        "core = kubernetes.client.CoreV1Api()\n"
        "try:\n"
        f"    core.list_namespaced_pod({namespace!r}); answer = 'allowed'\n"
        "except kubernetes.client.ApiException as exc:\n"
        "    answer = str(exc.status)\n"
        f"open({str(tmp_path / 'answer')!r}, 'w').write(answer)\n")
    cluster.apply(namespace, pod("client", ["python3", "-c", script], restartPolicy="Never"))

    def answered() -> str:
        assert (tmp_path / "answer").exists()
        return (tmp_path / "answer").read_text()

    # The namespace's default account may not list pods: the API server says 403.
    assert await eventually(answered, TIMEOUT, period=0.5) == "403"

    def succeeded() -> None:
        assert cluster.get(namespace, "pod", "client")["status"]["phase"] == "Succeeded"

    await eventually(succeeded, TIMEOUT, period=0.5)


async def test_a_mount_over_the_checkout_leaves_the_host_environment_alone(
    cluster: Cluster, namespace: str
) -> None:
    """A checkout under /tmp runs pods that mount an emptyDir at /tmp: the host's PATH
    (to the checkout's .venv) must not become a folder of the volume, while the
    container's own values under the mount point still do."""
    checkout = str(Path(__file__).resolve().parents[2])
    script = f'test "$DATA" != {checkout} && asrpool --help > "$DATA/help"'
    cluster.apply(namespace, pod("over-checkout", ["sh", "-c", script], restartPolicy="Never",
                                 volumes=[{"name": "scratch", "emptyDir": {}}], container={
        "env": [{"name": "DATA", "value": checkout}],
        "volumeMounts": [{"name": "scratch", "mountPath": checkout}]}))

    def succeeded() -> None:
        terminated = container_state(cluster, namespace, "over-checkout")["state"]["terminated"]
        assert terminated["exitCode"] == 0, terminated

    await eventually(succeeded, TIMEOUT, period=0.5)
    written = list((cluster.state / "pods").glob(
        f"{namespace}_over-checkout_*/volumes/scratch/help"))
    assert len(written) == 1 and "usage: asrpool" in written[0].read_text()
