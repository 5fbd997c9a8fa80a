"""What the real-node tests hold: the kubeconfig, kubectl, and small pod builders."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from asrpool.common import processes
from tests.support import processes as support

IMAGE = "localhost/asrpool/nodetest:0.2"  # tools/cluster/node-images: a static busybox


@dataclasses.dataclass(frozen=True)
class NodeCluster:
    kubeconfig: Path
    kubectl_path: Path
    state: Path  # tools/cluster/up's workdir: each node's logs and files

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig),
                                 *args], capture_output=True, text=True, input=stdin,
                                check=False, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def apply(self, namespace: str, *manifests: dict[str, Any]) -> None:
        text = "\n".join(json.dumps(item) for item in manifests)
        self.kubectl("apply", "--namespace", namespace, "-f", "-", stdin=text)

    def get(self, namespace: str, kind: str, name: str) -> dict[str, Any]:
        result = self.kubectl("get", kind, name, "--namespace", namespace, "-o", "json")
        found: dict[str, Any] = json.loads(result.stdout)
        return found

    def wait_ready(self, namespace: str, target: str, timeout: int = 90) -> None:
        result = self.kubectl("wait", "--namespace", namespace, "--for=condition=Ready",
                              f"--timeout={timeout}s", target, check=False,
                              timeout=timeout + 10)
        if result.returncode != 0:
            described = self.kubectl("describe", "--namespace", namespace, target,
                                     check=False).stdout
            raise AssertionError(f"{target} not Ready: {result.stderr.strip()}\n"
                                 f"{described[-3000:]}")

    def wait_established(self, crd: str, timeout: float = 60.0) -> None:
        """Until the API server serves ``crd`` (``kubectl wait`` fails outright while the
        new CRD has no conditions at all)."""
        condition = '{.status.conditions[?(@.type=="Established")].status}'

        def established() -> bool:
            return self.kubectl("get", "crd", crd, "-o", f"jsonpath={condition}",
                                check=False).stdout == "True"
        try:
            processes.wait_until(established, timeout, crd, period=0.5)
        except processes.StartError:
            raise AssertionError(f"{crd} never became Established") from None

    def exec(self, namespace: str, pod: str, *command: str) -> str:
        return self.kubectl("exec", "--namespace", namespace, pod, "--", *command).stdout

    def http_get(self, namespace: str, pod: str, host: str, port: int,
                 check: bool = True) -> str:
        """The body ``pod`` gets for ``GET /`` from ``host:port`` (busybox's nc: this
        busybox's wget crashes), or the error."""
        request = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {host} {port}"
        result = self.kubectl("exec", "--namespace", namespace, pod, "--", "sh", "-c",
                              request, check=check)
        if result.returncode != 0:
            return f"(failed: {result.stderr.strip()})"
        return result.stdout.replace("\r", "").partition("\n\n")[2].strip()

    @contextlib.contextmanager
    def port_forward(self, namespace: str, pod: str, port: int) -> Iterator[int]:
        """A loopback port here forwarded to ``port`` inside ``pod`` (through the API
        server and the pod's kubelet, so no NetworkPolicy stands between)."""
        log = self.kubeconfig.parent / "port-forwards" / f"{namespace}-{pod}-{port}.log"
        log.unlink(missing_ok=True)  # the port an earlier forward printed is not this one's
        forward = processes.spawn(
            f"kubectl port-forward pod/{pod}",
            [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), "port-forward",
             "--namespace", namespace, "--address", "127.0.0.1", f"pod/{pod}", f":{port}"],
            log)
        try:
            try:
                found = support.wait_printed(forward, r".*127\.0\.0\.1:(\d+) ->.*", 60.0)
            except processes.StartError as exc:
                raise AssertionError(f"kubectl port-forward: {exc}: {forward.last_line()}"
                                     ) from None
            yield int(found.group(1))
        finally:
            forward.stop(10)

    def wait_for_service_account(self, namespace: str, timeout: float = 30.0) -> None:
        def made() -> bool:
            return self.kubectl("get", "serviceaccount", "default", "--namespace", namespace,
                                check=False).returncode == 0
        try:
            processes.wait_until(made, timeout, f"the default service account in {namespace}",
                                 period=0.3)
        except processes.StartError:
            raise AssertionError(f"no default service account in {namespace}") from None

    def waiting_reason(self, namespace: str, pod: str, reasons: set[str],
                       timeout: float = 90.0) -> dict[str, Any]:
        """The pod's container status once it waits for one of ``reasons``."""
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            statuses = self.get(namespace, "pod", pod)["status"].get("containerStatuses", [])
            status = statuses[0] if statuses else {}
            if status.get("state", {}).get("waiting", {}).get("reason") in reasons:
                return status
            time.sleep(1.0)
        raise AssertionError(f"{pod} never waited for {sorted(reasons)}: {status}")


def pod(name: str, command: str, *, node: str | None = None, labels: dict[str, str] | None = None,
        image: str = IMAGE, grace: int = 30, volumes: dict[str, str] | None = None,
        readiness_port: int | None = None) -> dict[str, Any]:
    """A pod running ``sh -c command`` (PID 1 is the shell), never pulling its image."""
    container: dict[str, Any] = {
        "name": "main", "image": image, "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", command],
        "volumeMounts": [{"name": key, "mountPath": path}
                         for key, path in (volumes or {}).items()],
    }
    if readiness_port is not None:
        container["readinessProbe"] = {"tcpSocket": {"port": readiness_port},
                                       "periodSeconds": 1}
    spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": grace,
        "enableServiceLinks": False,
        "volumes": [{"name": key, "emptyDir": {}} for key in (volumes or {})],
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


# Serves its own name over HTTP on 8080 with busybox's httpd, in the foreground.
SERVE = "mkdir -p /tmp/www && hostname > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"
