"""One cluster with two real nodes (``tools/cluster/up --real-nodes 2``) for the session.

It needs root, Go (or built binaries), containerd, runc, the CNI plugins, nftables,
iptables, conntrack, buildah and skopeo (``make system-deps``). Without one of them
these tests skip with one line saying why; under CI (``CI=true``) that is a failure
instead. The host's state is taken before the cluster starts, to be compared after it
stopped (``test_zz_host.py``).
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from asrpool.localcluster import realnodes
from tests.nodes import hoststate
from tests.nodes.clusters import NodeCluster

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools" / "cluster"
CONTROL_IMAGE = "ghcr.io/asrpool/asrpool-control:0.1.0"  # tools/images/build makes it
START_TIMEOUT = 400.0
STOP_TIMEOUT = 90.0


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the real-node tests, but: {reason}")
    pytest.skip(reason)


def _tool_output(name: str) -> list[str]:
    result = subprocess.run([str(TOOLS / name)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        _unavailable(lines[-1] if lines else f"tools/cluster/{name} failed")
    return result.stdout.strip().splitlines()


def _check_host() -> None:
    if os.geteuid() != 0:
        _unavailable("real nodes need root (network namespaces, mounts, cgroups)")
    problem = realnodes.missing_tool()
    if problem is not None:
        _unavailable(problem)
    for tool, package in (("buildah", "buildah"), ("skopeo", "skopeo")):
        if shutil.which(tool) is None:
            _unavailable(f"no {tool} on PATH (Debian package {package})")


def _read_lines(stream: object, lines: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put(line.strip())
    lines.put("")


class Running:
    """The ``tools/cluster/up`` process; :meth:`stop` is safe to call twice."""

    def __init__(self, process: subprocess.Popen[str], log: Path) -> None:
        self.process, self.log = process, log
        self.stopped = False

    def stop(self) -> int:
        if not self.stopped:
            self.stopped = True
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


@pytest.fixture(scope="session")
def built() -> tuple[Path, list[str]]:
    """The binaries' folder and the images to load: the node images' archives, and the
    project's control image when podman's store has it."""
    _check_host()
    images = _tool_output("node-images")
    if _in_podman_storage(CONTROL_IMAGE):
        images.append(CONTROL_IMAGE)
    return Path(_tool_output("build")[-1]), images


def _in_podman_storage(name: str) -> bool:
    if shutil.which("podman") is None:
        return False
    return subprocess.run(["podman", "image", "exists", name], check=False,
                          capture_output=True, timeout=120).returncode == 0


@pytest.fixture(scope="session")
def control_image(built: tuple[Path, list[str]]) -> str:
    """The project's control image, loaded into the nodes; without it (no
    ``tools/images/build`` run yet) the tests that need it skip, failing under CI once
    the repository has that tool."""
    if CONTROL_IMAGE not in built[1]:
        reason = f"{CONTROL_IMAGE} is not in podman's storage (run tools/images/build)"
        if (ROOT / "tools" / "images" / "build").exists():
            _unavailable(reason)
        pytest.skip(reason)
    return CONTROL_IMAGE


@pytest.fixture(scope="session")
def host_before(built: tuple[Path, list[str]]) -> hoststate.Snapshot:
    return hoststate.take()


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory, built: tuple[Path, list[str]],
                 host_before: hoststate.Snapshot) -> Iterator[tuple[NodeCluster, Running]]:
    bin_dir, archives = built
    workdir = tmp_path_factory.mktemp("realnodes")
    kubeconfig = workdir / "kubeconfig"
    log = workdir / "up.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [str(TOOLS / "up"), "--kubeconfig", str(kubeconfig), "--real-nodes", "2",
             "--workdir", str(workdir / "state"), "--exit-with-parent", "--images", *archives],
            stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True)
    running = Running(process, log)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True).start()
    try:
        line = lines.get(timeout=START_TIMEOUT)
    except queue.Empty:
        line = "(no answer)"
    if line != "ready":
        running.stop()
        text = log.read_text(errors="replace").strip().splitlines()
        pytest.fail(f"tools/cluster/up --real-nodes 2 did not print ready: "
                    f"{chr(10).join(text[-12:]) or line}")
    try:
        yield NodeCluster(kubeconfig, bin_dir / "kubectl", workdir / "state"), running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def cluster(real_cluster: tuple[NodeCluster, Running]) -> NodeCluster:
    return real_cluster[0]


@pytest.fixture
def namespace(cluster: NodeCluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait_for_service_account(name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
