"""One cluster with two real nodes (``tools/cluster/up --real-nodes 2``) for the session.

It needs root, Go (or built binaries), containerd, runc, the CNI plugins, nftables,
iptables, conntrack, buildah and skopeo (``make system-deps``). Without one of them
these tests skip with one line saying why; under CI (``CI=true``) that is a failure
instead. The host's state is taken before the cluster starts, to be compared after it
stopped (``test_zz_host.py``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from asrpool.common import processes
from asrpool_harness.localcluster import realnodes
from tests.nodes import hoststate
from tests.nodes.clusters import NodeCluster
from tests.support import imagebuilds
from tests.support import processes as support

HERE = Path(__file__).resolve().parent
GUIDE_WALK = HERE / "test_guide.py"
HOST_CHECK = HERE / "test_zz_host.py"
ROOT = HERE.parents[1]
SETUP_TIMEOUT = 1500.0
TOOLS = ROOT / "tools" / "cluster"
CONTROL_IMAGE = "ghcr.io/asrpool/asrpool-control:0.1.0"  # tools/images/build makes it
PROJECT_IMAGES = ("control", "server", "redis")  # tools/images/build's names for them
START_TIMEOUT = 1000.0  # the first start on a machine fills the seed (imagecache): minutes
STOP_TIMEOUT = 90.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The session's cluster starts in the setup of the first test here, which also
    loads the images into a seed containerd the first time (the server image: minutes):
    every test here gets a time limit that holds it.

    The production guide's walk (test_guide.py) runs after every other test here but the
    host's check: its nodes pull the project's images from a registry, and once they
    had, containerd 1.6's CRI no longer found the seeded name of the same image
    (``ghcr.io/asrpool/asrpool-control:0.1.0``: ErrImageNeverPull for the next test)."""
    for item in items:
        if item.path.is_relative_to(HERE) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SETUP_TIMEOUT))
    places = [index for index, item in enumerate(items) if item.path.is_relative_to(HERE)]
    last = {GUIDE_WALK: 1, HOST_CHECK: 2}  # a stable sort: the rest keep their order
    ours = sorted((items[index] for index in places), key=lambda item: last.get(item.path, 0))
    for index, item in zip(places, ours, strict=True):
        items[index] = item


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


class Running:
    """The ``tools/cluster/up`` process; :meth:`stop` is safe to call twice."""

    def __init__(self, child: processes.Child) -> None:
        self.child = child
        self.process, self.log = child.process, child.log
        self.stopped = False

    def stop(self) -> int:
        if not self.stopped:
            self.stopped = True
            # SIGTERM to the tool alone (it stops the nodes in order), then the whole
            # group's SIGKILL if it has not ended in time.
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=STOP_TIMEOUT)
            if self.child.alive():
                self.child.stop(0)
        return self.process.returncode


@pytest.fixture(scope="session")
def built() -> tuple[Path, list[str]]:
    """The binaries' folder and the images to load: the node images' archives, and the
    project's control, server and redis images (from podman's store)."""
    _check_host()
    return Path(_tool_output("build")[-1]), [*_tool_output("node-images"), *_project_images()]


def _project_images() -> list[str]:
    """The chart's images, built (or found unchanged) by tools/images/build: their names."""
    built = imagebuilds.build(PROJECT_IMAGES, _unavailable)
    return [built[image].name for image in PROJECT_IMAGES]


@pytest.fixture(scope="session")
def control_image(built: tuple[Path, list[str]]) -> str:
    assert CONTROL_IMAGE in built[1]
    return CONTROL_IMAGE


@pytest.fixture(scope="session")
def chart_images(built: tuple[Path, list[str]]) -> list[str]:
    """The images the chart and its pools run, loaded into the nodes."""
    images = [name for name in built[1] if not name.endswith(".tar")]
    assert len(images) == len(PROJECT_IMAGES), images
    return images


@pytest.fixture(scope="session")
def host_before(built: tuple[Path, list[str]]) -> hoststate.Snapshot:
    return hoststate.take()


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory, built: tuple[Path, list[str]],
                 host_before: hoststate.Snapshot) -> Iterator[tuple[NodeCluster, Running]]:
    bin_dir, archives = built
    workdir = tmp_path_factory.mktemp("realnodes")
    kubeconfig = workdir / "kubeconfig"
    running = Running(processes.spawn(
        "tools/cluster/up --real-nodes 2",
        [str(TOOLS / "up"), "--kubeconfig", str(kubeconfig), "--real-nodes", "2",
         "--workdir", str(workdir / "state"), "--exit-with-parent", "--images", *archives],
        workdir / "up.log"))
    try:
        support.wait_printed(running.child, "ready", START_TIMEOUT)
    except processes.StartError as exc:
        running.stop()
        text = running.log.read_text(errors="replace").strip().splitlines()
        pytest.fail(f"tools/cluster/up --real-nodes 2 did not print ready: "
                    f"{chr(10).join(text[-12:]) or exc}")
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
