"""Node objects and their leases, as a kubelet keeps them.

Each node is registered with allocatable CPU, memory, pods and ``nvidia.com/gpu``, a
``Ready`` condition and an internal address of its own (127.0.N.1); its Lease in
``kube-node-lease`` is renewed every few seconds, so the node lifecycle controller sees
it alive, and a node whose agent stops is marked unreachable as in a real cluster.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import kubernetes

LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
GPU_RESOURCE = "nvidia.com/gpu"
LOCAL_NODE_LABEL = "asrpool.io/local-node"


@dataclasses.dataclass(frozen=True)
class NodeShape:
    name: str
    index: int
    gpus: int
    cpu: str = "16"
    memory: str = "64Gi"
    max_pods: int = 110

    @property
    def address(self) -> str:
        return f"127.0.{10 + self.index}.1"

    def pod_address(self, slot: int) -> str:
        """The ``slot``-th pod address of this node (1..250): 127.0.N.(slot + 1)."""
        return f"127.0.{10 + self.index}.{slot + 1}"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_body(shape: NodeShape) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": shape.name, "labels": {
            "kubernetes.io/hostname": shape.name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", LOCAL_NODE_LABEL: "true"}},
        "spec": {},
    }


def node_status(shape: NodeShape) -> dict[str, Any]:
    resources = {"cpu": shape.cpu, "memory": shape.memory, "pods": str(shape.max_pods),
                 "ephemeral-storage": "100Gi", GPU_RESOURCE: str(shape.gpus)}
    stamp = now()

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {"type": kind, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}

    return {
        "capacity": resources,
        "allocatable": resources,
        "addresses": [{"type": "InternalIP", "address": shape.address},
                      {"type": "Hostname", "address": shape.name}],
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "enough memory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "enough PIDs"),
            condition("Ready", "True", "KubeletReady", "asrpool local node agent is ready"),
        ],
        "nodeInfo": {"kubeletVersion": "asrpool-local", "kubeProxyVersion": "",
                     "operatingSystem": "linux", "architecture": "amd64",
                     "containerRuntimeVersion": "asrpool-local://processes",
                     "osImage": "host processes", "kernelVersion": "", "machineID": "",
                     "systemUUID": "", "bootID": ""},
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
    }


class NodeKeeper:
    """Registers the nodes, reports their status and renews their leases."""

    def __init__(self, api: kubernetes.client.ApiClient, shapes: list[NodeShape]) -> None:
        self.core = kubernetes.client.CoreV1Api(api)
        self.leases = kubernetes.client.CoordinationV1Api(api)
        self.shapes = shapes

    def register(self) -> None:
        for shape in self.shapes:
            try:
                self.core.create_node(node_body(shape))
            except kubernetes.client.ApiException as exc:
                if exc.status != 409:
                    raise
            self.report(shape)

    def report(self, shape: NodeShape) -> None:
        self.core.patch_node_status(shape.name, {"status": node_status(shape)})

    def renew(self) -> None:
        for shape in self.shapes:
            self._renew_lease(shape)

    def _renew_lease(self, shape: NodeShape) -> None:
        spec = {"holderIdentity": shape.name, "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": micro_now()}
        try:
            self.leases.patch_namespaced_lease(shape.name, LEASE_NAMESPACE, {"spec": spec})
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
            node = self.core.read_node(shape.name)
            owner = {"apiVersion": "v1", "kind": "Node", "name": shape.name,
                     "uid": node.metadata.uid}
            self.leases.create_namespaced_lease(LEASE_NAMESPACE, {
                "metadata": {"name": shape.name, "ownerReferences": [owner]}, "spec": spec})

    def remove(self) -> None:
        for shape in self.shapes:
            try:
                self.core.delete_node(shape.name)
            except kubernetes.client.ApiException as exc:
                if exc.status != 404:
                    raise
