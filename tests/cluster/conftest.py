"""One real control plane (``tools/cluster/up``) for the whole test session.

The binaries are built by ``tools/cluster/build`` (``make test`` runs it first). Without
a Go toolchain and without built binaries these tests skip with one line saying why;
under CI (``CI=true``) that is a failure instead, so CI can never go green by skipping.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from asrpool.common import processes
from tests.cluster.clusters import Cluster
from tests.support import processes as support

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools" / "cluster"
CRD_PATH = ROOT / "crds" / "streamingasrpools.asrpool.io.yaml"
START_TIMEOUT = 240.0
STOP_TIMEOUT = 60.0


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the control-plane tests, but: {reason}")
    pytest.skip(reason)


def _build() -> Path:
    result = subprocess.run([str(TOOLS / "build")], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        _unavailable(result.stderr.strip().splitlines()[-1] if result.stderr.strip()
                     else "tools/cluster/build failed")
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    bin_dir = _build()
    workdir = tmp_path_factory.mktemp("cluster")
    kubeconfig = workdir / "kubeconfig"
    up = processes.spawn(
        "tools/cluster/up",
        [str(TOOLS / "up"), "--kubeconfig", str(kubeconfig), "--nodes", "2",
         "--gpus-per-node", "2", "--workdir", str(workdir / "state"), "--exit-with-parent"],
        workdir / "up.log")
    try:
        support.wait_printed(up, "ready", START_TIMEOUT)
    except processes.StartError as exc:
        up.stop(STOP_TIMEOUT)
        log = up.log.read_text(errors="replace").strip().splitlines()
        pytest.fail(f"tools/cluster/up did not print ready: {log[-1:] or exc}")
    try:
        yield Cluster(kubeconfig, bin_dir / "kubectl", workdir / "state")
    finally:
        # SIGTERM to the tool alone (it stops what it started, in order), then the
        # whole group's SIGKILL if it has not ended in time.
        up.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            up.process.wait(timeout=STOP_TIMEOUT)
        if up.alive():
            up.stop(0)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace for one test, deleted after it (with everything in it)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = kubernetes.client.CoreV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": name}})
    cluster.wait_for_service_account(name)
    try:
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> None:
    """The CRD as shipped, applied once and established."""
    cluster.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/streamingasrpools.asrpool.io")
