"""A stand-in for the Deployment controller and the kubelet: real server processes.

For one Deployment in the emulator, :meth:`Kubelet.sync` makes the pods match its
replicas the way a cluster would: fewer pods wanted, the pods of lowest
``pod-deletion-cost`` are deleted and their processes get SIGTERM (then SIGKILL after
the termination grace period); more wanted, new pods are created and their container
runs as a real ``asrpool serve`` process with the environment the pod template gives
it (``envFrom`` the ConfigMap, the downward API, ``$(VAR)`` expansion). Each pod gets
its own loopback address as its IP, so every pod listens on port 8080 as in a cluster;
``ASRPOOL_HOST`` is set to that address (inside a pod, 0.0.0.0 means the pod's own).
The environment is resolved by the same code as the local node agent's
(:mod:`asrpool_harness.localcluster.podspecs`); the real control-plane tests use that agent.
Readiness comes from each pod's ``/readyz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from asrpool.common import processes
from asrpool.operator import kube, naming
from asrpool_harness.localcluster import podspecs
from tests.operator import emulator

HOST_ENV = ("PATH", "HOME", "LANG", "TMPDIR")


@dataclasses.dataclass
class RunningPod:
    name: str
    ip: str
    child: processes.Child
    grace: float

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.child.process

    @property
    def log(self) -> Path:
        return self.child.log

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.ip}:8080/readyz", timeout=1) as answer:
                return int(answer.status) == 200
        except (urllib.error.URLError, OSError):
            return False


class Kubelet:
    def __init__(self, cluster: emulator.Cluster, namespace: str, deployment: str,
                 workdir: Path) -> None:
        self.cluster, self.namespace, self.deployment = cluster, namespace, deployment
        self.workdir = workdir
        self.subnet = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
        self.running: dict[str, RunningPod] = {}
        self.terminated: dict[str, RunningPod] = {}
        self._next = 0

    async def sync(self) -> None:
        deployment = self.cluster.get(emulator.DEPLOYMENTS, self.namespace, self.deployment)
        if deployment is None:
            return
        wanted = int(deployment["spec"]["replicas"])
        pods = self.cluster.pods_of(self.namespace, self.deployment)
        for pod in _cheapest_first(pods)[: max(0, len(pods) - wanted)]:
            await self._stop(pod["metadata"]["name"])
        for _ in range(len(pods), wanted):
            await self._start(deployment)
        await self._report(deployment)

    async def run(self, period: float = 0.2) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(period)

    async def _start(self, deployment: Mapping[str, Any]) -> None:
        index, self._next = self._next, self._next + 1
        ip = f"{self.subnet}.{index + 1}"
        pod = emulator._pod(deployment, index)
        pod["status"]["podIP"] = ip
        await self.cluster.create(pod)
        name = pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        env = self.environment(container, name, ip)
        log = self.workdir / f"{name}.log"
        command = [sys.executable, "-m", "asrpool.cli", *container["command"][1:]]
        child = processes.spawn(f"pod {name}", command, log, env=env, cwd=self.workdir)
        grace = float(pod["spec"]["terminationGracePeriodSeconds"])
        self.running[name] = RunningPod(name, ip, child, grace)

    def environment(self, container: Mapping[str, Any], pod_name: str, ip: str) -> dict[str, str]:
        """The container's environment, resolved as the local node agent resolves it."""
        base = {key: os.environ[key] for key in HOST_ENV if key in os.environ}
        pod = {"metadata": {"name": pod_name, "namespace": self.namespace}, "spec": {}}
        env = podspecs.environment(container, self._lookup, podspecs.field_values(pod, ip, ip),
                                   base)
        env["ASRPOOL_HOST"] = ip
        env["ASRPOOL_LOG_LEVEL"] = "warning"
        return env

    def _lookup(self, kind: str, name: str) -> dict[str, str] | None:
        assert kind == "configmap", f"the emulated kubelet reads no {kind}s"
        config_map = self.cluster.get(emulator.CONFIG_MAPS, self.namespace, name)
        return None if config_map is None else dict(config_map["data"])

    async def _stop(self, name: str) -> None:
        await self.cluster.delete(kube.PODS, self.namespace, name)
        pod = self.running.pop(name)
        pod.process.send_signal(signal.SIGTERM)
        self.terminated[name] = pod

    async def _report(self, deployment: Mapping[str, Any]) -> None:
        ready = [await asyncio.to_thread(pod.ready) for pod in self.running.values()]
        count = len(self.running)
        status = {"observedGeneration": deployment["metadata"]["generation"], "replicas": count,
                  "updatedReplicas": count, "readyReplicas": sum(ready),
                  "availableReplicas": sum(ready)}
        if {k: deployment.get("status", {}).get(k) for k in status} != status:
            await self.cluster.patch(kube.DEPLOYMENTS, self.namespace, self.deployment,
                                     {"status": status}, subresource="status")

    def shutdown(self) -> None:
        """SIGTERM every process, SIGKILL what outlives its grace period."""
        pods = [*self.running.values(), *self.terminated.values()]
        for pod in pods:
            if pod.process.poll() is None:
                pod.process.send_signal(signal.SIGTERM)
        for pod in pods:
            with contextlib.suppress(subprocess.TimeoutExpired):
                pod.process.wait(timeout=pod.grace)
            if pod.child.alive():
                pod.child.stop(0)  # SIGKILL, its group too


def _cheapest_first(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def cost(pod: dict[str, Any]) -> int:
        annotations = pod["metadata"].get("annotations") or {}
        return int(annotations.get(naming.DELETION_COST_ANNOTATION, "0"))
    return sorted(pods, key=cost)
