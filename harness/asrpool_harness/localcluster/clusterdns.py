"""The cluster DNS of real nodes: CoreDNS on the host's bridge address, port 53, behind
the ``kube-system/kube-dns`` Service as in any cluster.

Its kubernetes plugin answers ``cluster.local`` (and reverse lookups of pod and
Service addresses) from the API server, with the administrator's kubeconfig. It has no
forwarder: a name outside the cluster gets no answer from anywhere else, as nothing
leaves the machine. Pods ask the Service's address (``controlplane.DNS_SERVICE_IP``,
every kubelet's ``clusterDNS``), which kube-proxy sends to CoreDNS through an
EndpointSlice naming the host's address: so a pod's DNS traffic is Service traffic, as
NetworkPolicies that allow DNS to ``kube-dns`` expect.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from asrpool.common import processes
from asrpool_harness.localcluster import controlplane, kubelets

START_TIMEOUT = 60.0


def corefile(address: str, kubeconfig: Path, ready_port: int) -> str:
    return f""".:53 {{
    bind {address}
    ready 127.0.0.1:{ready_port}
    errors
    loadbalance
    cache 5
    kubernetes {kubelets.CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {kubeconfig} local
        pods insecure
    }}
}}
"""


def start(binary: Path, address: str, kubeconfig: Path, workdir: Path) -> processes.Child:
    """CoreDNS started and answering (its kubernetes plugin has synced)."""
    ready_port = processes.free_port()
    path = workdir / "Corefile"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(corefile(address, kubeconfig, ready_port))
    child = processes.spawn("coredns", [str(binary), "-conf", str(path)],
                            workdir / "logs" / "coredns.log")
    processes.wait_until(lambda: _ready(ready_port), START_TIMEOUT, "coredns", [child])
    return child


def _ready(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as answer:
        return int(answer.status) == 200


def service(address: str) -> list[dict[str, Any]]:
    """The ``kube-dns`` Service (no selector) and its EndpointSlice: CoreDNS at
    ``address``."""
    ports = [{"name": "dns", "port": 53, "protocol": "UDP"},
             {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]
    return [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": "kube-system",
                      "labels": {"k8s-app": "kube-dns"}},
         "spec": {"clusterIP": controlplane.DNS_SERVICE_IP,
                  "ports": [port | {"targetPort": 53} for port in ports]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "kube-dns-coredns", "namespace": "kube-system",
                      "labels": {"kubernetes.io/service-name": "kube-dns",
                                 "endpointslice.kubernetes.io/managed-by": "asrpool"}},
         "addressType": "IPv4",
         "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
         "ports": ports},
    ]


def publish(kubectl: Path, kubeconfig: Path, address: str) -> None:
    """Create the ``kube-dns`` Service for CoreDNS at ``address``."""
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": service(address)})
    done = subprocess.run([str(kubectl), "--kubeconfig", str(kubeconfig), "apply", "-f", "-"],
                          input=manifest, capture_output=True, text=True, timeout=60,
                          check=False)
    if done.returncode != 0:
        raise processes.StartError(f"could not create the kube-dns Service: "
                                   f"{done.stderr.strip()}")
