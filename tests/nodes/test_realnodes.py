"""Pods in real containers on real kubelets: networks, Services, DNS, signals, failures."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from asrpool_harness.localcluster import controlplane, netns, realnodes
from tests.nodes import clusters
from tests.nodes.clusters import SERVE, NodeCluster


def test_every_node_is_a_ready_kubelet_on_containerd(cluster: NodeCluster) -> None:
    items = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert sorted(item["metadata"]["name"] for item in items) == ["node-0", "node-1"]
    for item in items:
        info = item["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.35.4"
        assert info["containerRuntimeVersion"].startswith("containerd://")
        ready = [c for c in item["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True", ready


def _kubelet_status(address: str, token: str | None) -> int:
    """The status a kubelet's API answers ``GET /pods`` with (its serving certificate is
    its own, self-signed: not checked here)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"https://{address}:10250/pods", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_kubelet_serves_only_callers_the_api_server_vouches_for(
        cluster: NodeCluster, namespace: str) -> None:
    """Webhook authentication and authorization on every kubelet's API, as on a
    production cluster: no anonymous caller (401); a service account's token is known
    but given no node rights (403); the administrator's is allowed. The API server's
    own client certificate reaching logs, exec and port-forward is what the other tests
    here use."""
    cluster.kubectl("create", "serviceaccount", "reader", "--namespace", namespace)
    reader = cluster.kubectl("create", "token", "reader", "--namespace", namespace).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())["users"][0]["user"]["token"]
    for item in json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]:
        address = next(a["address"] for a in item["status"]["addresses"]
                       if a["type"] == "InternalIP")
        statuses = [_kubelet_status(address, token) for token in (None, reader, admin)]
        assert statuses == [401, 403, 200], (item["metadata"]["name"], statuses)


def test_a_deployment_runs_in_its_own_network_namespace_with_a_pod_address(
        cluster: NodeCluster, namespace: str) -> None:
    template = clusters.pod("web", SERVE, labels={"app": "web"}, readiness_port=8080)
    cluster.apply(namespace, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": template["metadata"], "spec": template["spec"]}}})
    cluster.kubectl("rollout", "status", "--namespace", namespace, "deployment/web",
                    "--timeout=120s", timeout=130)
    pods = json.loads(cluster.kubectl("get", "pods", "--namespace", namespace, "-l", "app=web",
                                      "-o", "json").stdout)["items"]
    host_netns = os.readlink("/proc/self/ns/net")
    for item in pods:
        index = int(item["spec"]["nodeName"].removeprefix("node-"))
        node = netns.NodeNet("", index)
        address = ipaddress.ip_address(item["status"]["podIP"])
        assert address in ipaddress.ip_network(node.pod_network), (address, node.pod_network)
        name = item["metadata"]["name"]
        inside = cluster.exec(namespace, name, "readlink", "/proc/1/ns/net").strip()
        assert inside.startswith("net:[") and inside != host_netns
        assert str(address) in cluster.exec(namespace, name, "ip", "-4", "addr", "show", "eth0")
        assert cluster.exec(namespace, name, "cat", "/proc/1/comm").strip() == "httpd"


def test_the_control_image_runs_as_its_user_with_a_read_only_root(
        cluster: NodeCluster, namespace: str, control_image: str) -> None:
    container = {
        "name": "main", "image": control_image, "imagePullPolicy": "Never",
        "command": ["python", "-m", "http.server", "8080", "--bind", "0.0.0.0",
                    "--directory", "/opt/asrpool"],
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}
    cluster.apply(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "control"},
        "spec": {"securityContext": {"runAsUser": 10001, "runAsGroup": 10001,
                                     "runAsNonRoot": True},
                 "containers": [container]}})
    cluster.wait_ready(namespace, "pod/control", timeout=120)
    assert cluster.exec(namespace, "control", "id", "-u").strip() == "10001"
    write = cluster.kubectl("exec", "--namespace", namespace, "control", "--", "touch", "/x",
                            check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr
    assert "usage: asrpool" in cluster.exec(namespace, "control", "asrpool", "--help")


def test_a_pod_reaches_a_pod_on_the_other_node_by_its_address(
        cluster: NodeCluster, namespace: str) -> None:
    cluster.apply(namespace,
                  clusters.pod("server", SERVE, node="node-1", readiness_port=8080),
                  clusters.pod("client", "exec sleep 3600", node="node-0"))
    cluster.wait_ready(namespace, "pod/server")
    cluster.wait_ready(namespace, "pod/client")
    server_ip = cluster.get(namespace, "pod", "server")["status"]["podIP"]
    assert cluster.http_get(namespace, "client", server_ip, 8080) == "server"


def test_a_service_address_and_its_dns_name_reach_a_pod(
        cluster: NodeCluster, namespace: str) -> None:
    cluster.apply(namespace,
                  clusters.pod("backend", SERVE, node="node-1", labels={"app": "backend"},
                               readiness_port=8080),
                  clusters.pod("caller", "exec sleep 3600", node="node-0"),
                  clusters.pod("neighbour", "exec sleep 3600", node="node-1"),
                  {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "backend"},
                   "spec": {"selector": {"app": "backend"},
                            "ports": [{"port": 80, "targetPort": 8080}]}})
    for name in ("backend", "caller", "neighbour"):
        cluster.wait_ready(namespace, f"pod/{name}")
    vip = cluster.get(namespace, "service", "backend")["spec"]["clusterIP"]
    assert ipaddress.ip_address(vip) in ipaddress.ip_network("198.19.0.0/16")
    dns_name = f"backend.{namespace}.svc.cluster.local"
    for caller in ("caller", "neighbour"):  # from the other node and from the same one
        for target in (vip, dns_name):
            answer = _fetch(cluster, namespace, caller, target)
            assert answer == "backend", (caller, target, answer)
    looked_up = cluster.kubectl("exec", "--namespace", namespace, "caller", "--", "nslookup",
                                "-type=a", f"{dns_name}.", check=False)
    assert vip in looked_up.stdout, (looked_up.stdout, looked_up.stderr)


def test_pods_ask_the_kube_dns_service_and_coredns_answers(
        cluster: NodeCluster, namespace: str) -> None:
    service = cluster.get("kube-system", "service", "kube-dns")
    assert service["spec"]["clusterIP"] == controlplane.DNS_SERVICE_IP
    cluster.apply(namespace, clusters.pod("asker", "exec sleep 3600", node="node-1"))
    cluster.wait_ready(namespace, "pod/asker")
    resolv = cluster.exec(namespace, "asker", "cat", "/etc/resolv.conf")
    assert f"nameserver {controlplane.DNS_SERVICE_IP}" in resolv.splitlines(), resolv
    looked_up = cluster.kubectl("exec", "--namespace", namespace, "asker", "--", "nslookup",
                                "-type=a", "kubernetes.default.svc.cluster.local.", check=False)
    # busybox names the server it asked, then the answer
    assert controlplane.DNS_SERVICE_IP in looked_up.stdout, looked_up.stdout
    assert controlplane.KUBERNETES_SERVICE_IP in looked_up.stdout, looked_up.stdout


def test_a_kubelet_s_credentials_reach_only_its_own_node_and_its_pods(
        cluster: NodeCluster, namespace: str) -> None:
    """The Node authorizer and NodeRestriction, on each kubelet's own identity."""
    as_node = dataclasses.replace(cluster, kubeconfig=cluster.state / "node-0" /
                                  "kubelet.kubeconfig")
    who = json.loads(as_node.kubectl("auth", "whoami", "-o", "json").stdout)["status"]
    assert who["userInfo"]["username"] == realnodes.node_user("node-0")
    assert "system:nodes" in who["userInfo"]["groups"]
    assert as_node.kubectl("get", "node", "node-0", "-o", "name").stdout.strip() == "node/node-0"
    cluster.kubectl("create", "secret", "generic", "unrelated", "--namespace", namespace,
                    "--from-literal=key=value")
    refused = as_node.kubectl("get", "secret", "unrelated", "--namespace", namespace,
                              check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr
    other = as_node.kubectl("label", "node", "node-1", "asrpool.test/by=node-0", check=False)
    assert other.returncode != 0 and "forbidden" in other.stderr.lower(), other.stderr


def _fetch(cluster: NodeCluster, namespace: str, pod: str, host: str) -> str:
    """``GET /`` on port 80 from ``pod``, retried for a few seconds: kube-proxy and the
    DNS learn a new Service's endpoints a moment after the pod is Ready."""
    deadline = time.monotonic() + 20
    while True:
        answer = cluster.http_get(namespace, pod, host, 80, check=False)
        if answer == "backend" or time.monotonic() > deadline:
            return answer
        time.sleep(1)


def test_deleting_a_pod_sends_sigterm_to_pid_1_and_waits_out_its_grace(
        cluster: NodeCluster, namespace: str, tmp_path: Path) -> None:
    record = tmp_path / "record"
    record.mkdir()
    script = ("trap 'echo term >> /record/log; sleep 3; echo done >> /record/log; exit 0' TERM;"
              " echo started >> /record/log; while true; do sleep 1; done")
    manifest = clusters.pod("graceful", script, grace=30)
    manifest["spec"]["volumes"] = [{"name": "record", "hostPath": {"path": str(record)}}]
    manifest["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "record", "mountPath": "/record"}]
    cluster.apply(namespace, manifest)
    cluster.wait_ready(namespace, "pod/graceful")
    cluster.kubectl("delete", "pod", "graceful", "--namespace", namespace, "--wait=true",
                    timeout=60)
    # "done" is written 3 s after SIGTERM: the kubelet waited for PID 1 instead of
    # killing it at once.
    assert (record / "log").read_text().split() == ["started", "term", "done"]


def test_a_pod_ignoring_sigterm_is_killed_when_its_grace_ends(
        cluster: NodeCluster, namespace: str) -> None:
    cluster.apply(namespace, clusters.pod("stubborn", "trap '' TERM; while true; do sleep 1; done",
                                          grace=2))
    cluster.wait_ready(namespace, "pod/stubborn")
    began = time.monotonic()
    cluster.kubectl("delete", "pod", "stubborn", "--namespace", namespace, "--wait=true",
                    timeout=60)
    assert time.monotonic() - began >= 2.0


def test_a_missing_image_shows_err_image_never_pull(
        cluster: NodeCluster, namespace: str) -> None:
    cluster.apply(namespace, clusters.pod("absent", "true",
                                          image="localhost/asrpool/absent:0.0"))
    status = cluster.waiting_reason(namespace, "absent", {"ErrImageNeverPull"})
    assert "localhost/asrpool/absent:0.0" in status["state"]["waiting"]["message"]


def test_a_crashing_container_shows_crash_loop_back_off_and_its_last_output(
        cluster: NodeCluster, namespace: str) -> None:
    cluster.apply(namespace, clusters.pod("crasher", "echo boom-from-container; exit 3"))
    status = cluster.waiting_reason(namespace, "crasher", {"CrashLoopBackOff"})
    assert status["lastState"]["terminated"]["exitCode"] == 3
    # The kubelet may be restarting it meanwhile (a log then briefly "unable to
    # retrieve"): ask again for a while.
    deadline = time.monotonic() + 60
    logs = ""
    while "boom-from-container" not in logs and time.monotonic() < deadline:
        logs = cluster.kubectl("logs", "--namespace", namespace, "crasher", "--previous",
                               check=False).stdout
        time.sleep(1)
    assert "boom-from-container" in logs, logs


def test_a_missing_tool_is_one_line_naming_its_debian_package(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnodes, "TOOLS", {"asrpool-no-such-tool": "asrpool-package"})
    assert realnodes.missing_tool() == (
        "no asrpool-no-such-tool on PATH (Debian package asrpool-package)")
