"""The cluster DNS of real nodes: CoreDNS on the host's bridge address, port 53.

Its kubernetes plugin answers ``cluster.local`` (and reverse lookups of pod and
Service addresses) from the API server, with the administrator's kubeconfig. It has no
forwarder: a name outside the cluster gets no answer from anywhere else, as nothing
leaves the machine.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

from asrpool.common import processes
from asrpool.localcluster import kubelets

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
