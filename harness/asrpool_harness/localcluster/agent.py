"""The node agent: registers the nodes and runs the pods scheduled to them.

It lists and watches every pod, starts a :class:`pods.PodRunner` for each new pod bound
to one of its nodes, asks the runner to stop when the pod gets a deletion timestamp,
hands each pod an address of its node's range, and keeps the nodes' leases fresh.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes

from asrpool_harness.localcluster import controlplane, nodes, pods

log = logging.getLogger(__name__)

RENEW_SECONDS = 5.0
STATUS_SECONDS = 30.0
WATCH_SECONDS = 30
PODS_PER_NODE = 250
STOP_GRACE = 10.0  # a whole cluster's shutdown does not wait out long drains


def api_client(access: controlplane.Access) -> kubernetes.client.ApiClient:
    configuration = kubernetes.client.Configuration()
    configuration.host = access.server
    configuration.ssl_ca_cert = str(access.ca_cert)
    configuration.api_key = {"authorization": f"Bearer {access.token}"}
    return kubernetes.client.ApiClient(configuration)


class Addresses:
    """Each node's pod addresses, handed out and given back."""

    def __init__(self, shapes: list[nodes.NodeShape]) -> None:
        self._free = {shape.name: [shape.pod_address(slot) for slot in range(1, PODS_PER_NODE)]
                      for shape in shapes}
        self._lock = threading.Lock()

    def take(self, node: str) -> str:
        with self._lock:
            if not self._free[node]:
                raise RuntimeError(f"node {node} has no pod address left")
            return self._free[node].pop(0)

    def give_back(self, node: str, address: str) -> None:
        with self._lock:
            self._free[node].append(address)


class NodeAgent:
    def __init__(self, access: controlplane.Access, shapes: list[nodes.NodeShape],
                 workdir: Path) -> None:
        self.api = api_client(access)
        self.shapes = {shape.name: shape for shape in shapes}
        self.keeper = nodes.NodeKeeper(self.api, shapes)
        self.addresses = Addresses(shapes)
        self.context = pods.Context(self.api, access.server, access.ca_cert, workdir,
                                    self._event)
        self.runners: dict[str, pods.PodRunner] = {}
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self.keeper.register()
        self.keeper.renew()
        for target in (self._keep_nodes, self._watch_pods):
            thread = threading.Thread(target=target, name=target.__name__, daemon=True)
            thread.start()
            self._threads.append(thread)

    def nodes_ready(self) -> bool:
        core = kubernetes.client.CoreV1Api(self.api)
        for name in self.shapes:
            node = core.read_node(name)
            ready = [c for c in node.status.conditions or [] if c.type == "Ready"]
            if not ready or ready[0].status != "True":
                return False
        return True

    # Nodes.

    def _keep_nodes(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(RENEW_SECONDS):
            try:
                self.keeper.renew()
                if time.monotonic() - last_status >= STATUS_SECONDS:
                    for shape in self.shapes.values():
                        self.keeper.report(shape)
                    last_status = time.monotonic()
            except Exception as exc:  # the API may be restarting; try again next time
                log.warning("node heartbeat failed: %s", exc)

    # Pods.

    def _watch_pods(self) -> None:
        core = kubernetes.client.CoreV1Api(self.api)
        while not self.stopping.is_set():
            try:
                listed = core.list_pod_for_all_namespaces()
                for pod in listed.items:
                    self._sync(self.api.sanitize_for_serialization(pod))
                self._reap()
                watch = kubernetes.watch.Watch()
                for event in watch.stream(core.list_pod_for_all_namespaces,
                                          resource_version=listed.metadata.resource_version,
                                          timeout_seconds=WATCH_SECONDS):
                    if self.stopping.is_set():
                        watch.stop()
                        break
                    self._sync(self.api.sanitize_for_serialization(event["object"]),
                               deleted=event["type"] == "DELETED")
                    self._reap()
            except Exception as exc:
                if not self.stopping.is_set():
                    log.warning("pod watch interrupted: %s", exc)
                    time.sleep(1.0)

    def _sync(self, pod: dict[str, Any], deleted: bool = False) -> None:
        node = pod["spec"].get("nodeName")
        if node not in self.shapes:
            return
        uid = pod["metadata"]["uid"]
        runner = self.runners.get(uid)
        deletion = pod["metadata"].get("deletionTimestamp")
        if runner is None:
            if deleted:
                return
            if deletion:
                self._delete_now(pod)
                return
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return
            self._run(pod, node)
        elif deleted:
            runner.request_stop(0.0)
        elif deletion:
            if runner.finished.is_set():
                self._delete_now(pod)
            runner.request_stop(_grace_of(pod))

    def _run(self, pod: dict[str, Any], node: str) -> None:
        address = self.addresses.take(node)
        runner = pods.PodRunner(pod, self.shapes[node], address, self.context)
        self.runners[pod["metadata"]["uid"]] = runner
        runner.start()

    def _reap(self) -> None:
        for uid, runner in list(self.runners.items()):
            if runner.finished.is_set() and runner.deleting.is_set():
                del self.runners[uid]
                self.addresses.give_back(runner.node.name, runner.address)

    def _delete_now(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        core = kubernetes.client.CoreV1Api(self.api)
        with contextlib.suppress(kubernetes.client.ApiException):
            core.delete_namespaced_pod(meta["name"], meta["namespace"], body={
                "gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})

    def _event(self, pod: dict[str, Any], kind: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        stamp = nodes.micro_now()
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "reason": reason, "message": message, "type": kind,
            "source": {"component": "kubelet", "host": pod["spec"].get("nodeName", "")},
            "firstTimestamp": stamp[:19] + "Z", "lastTimestamp": stamp[:19] + "Z", "count": 1,
        }
        with contextlib.suppress(kubernetes.client.ApiException):
            kubernetes.client.CoreV1Api(self.api).create_namespaced_event(meta["namespace"], body)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop every pod at once (each gets SIGTERM, then SIGKILL after at most ``grace``
        seconds), then the watch and the heartbeat."""
        self.stopping.set()
        for runner in list(self.runners.values()):
            runner.request_stop(grace)
        for runner in list(self.runners.values()):
            runner.finished.wait(grace + 5)
        for thread in self._threads:
            thread.join(timeout=1)
        self.api.close()


def _grace_of(pod: dict[str, Any]) -> float | None:
    seconds = pod["metadata"].get("deletionGracePeriodSeconds")
    return None if seconds is None else float(seconds)
