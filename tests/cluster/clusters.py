"""What the control-plane tests hold: the kubeconfig, an API client, kubectl, pod files."""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes

from asrpool.common import processes


@dataclasses.dataclass(frozen=True)
class Cluster:
    kubeconfig: Path
    kubectl_path: Path
    state: Path  # the node agent's folder: pods' logs and volumes

    @functools.cached_property
    def api(self) -> kubernetes.client.ApiClient:
        return kubernetes.config.new_client_from_config(str(self.kubeconfig))

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None
                ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig),
                                 *args], capture_output=True, text=True, input=stdin,
                                check=False, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def apply(self, namespace: str, manifest: dict[str, Any] | list[dict[str, Any]]) -> None:
        items = manifest if isinstance(manifest, list) else [manifest]
        text = "\n".join(json.dumps(item) for item in items)
        self.kubectl("apply", "--server-side", "--namespace", namespace, "-f", "-", stdin=text)

    def get(self, namespace: str, kind: str, name: str) -> dict[str, Any]:
        result = self.kubectl("get", kind, name, "--namespace", namespace, "-o", "json")
        found: dict[str, Any] = json.loads(result.stdout)
        return found

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        """A container's output, from the node agent's folder (no kubelet API here)."""
        logs = list((self.state / "pods").glob(f"{namespace}_{pod}_*/{container}.log"))
        return "".join(path.read_text(errors="replace") for path in logs)

    def wait_for_service_account(self, namespace: str, timeout: float = 30.0) -> None:
        """Pods are refused until the controller manager made the namespace's ``default``."""
        core = kubernetes.client.CoreV1Api(self.api)

        def made() -> bool:
            try:
                core.read_namespaced_service_account("default", namespace)
            except kubernetes.client.ApiException:
                return False
            return True

        try:
            processes.wait_until(made, timeout, f"the default service account in {namespace}")
        except processes.StartError:
            raise AssertionError(f"no default service account in {namespace}") from None
