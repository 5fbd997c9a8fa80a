"""After a real-node cluster stops, the host is as it was before it started (and its kept
folder holds no copy of the images); a node that never gets Ready says why.

Named to run last in this folder: it stops the session's cluster.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.nodes import hoststate
from tests.nodes.clusters import NodeCluster
from tests.nodes.conftest import ROOT, Running


def test_stopping_leaves_the_host_as_it_found_it(
        real_cluster: tuple[NodeCluster, Running], host_before: hoststate.Snapshot) -> None:
    cluster, running = real_cluster
    # Something running in a container when the stop comes.
    cluster.kubectl("run", "last", "--image", "localhost/asrpool/nodetest:0.2",
                    "--image-pull-policy", "Never", "--restart", "Never", "--",
                    "sleep", "3600")
    cluster.kubectl("wait", "--for=condition=Ready", "pod/last", "--timeout=90s", timeout=100)
    assert running.stop() == 0, running.log.read_text(errors="replace")[-2000:]
    assert hoststate.differences(host_before, hoststate.take()) == {}
    # The kept folder keeps the logs, not the nodes' copies of the seed (which would
    # hold its gigabytes on disk once a changed image replaced it).
    assert len(list(cluster.state.glob("node-*/logs/kubelet.log"))) == 2
    assert list(cluster.state.glob("node-*/containerd/root")) == []


BROKEN_KUBELET = """#!/bin/sh
echo "E1202 kubelet.go:1] broken on purpose by the test"
exec sleep 600
"""


def test_a_node_that_never_gets_ready_shows_its_kubelets_last_lines_and_cleans_up(
        built: tuple[Path, list[str]], tmp_path: Path,
        real_cluster: tuple[NodeCluster, Running]) -> None:
    real_cluster[1].stop()  # one real-node cluster at a time: the range is the host's
    bin_dir, archives = built
    fake = tmp_path / "bin"
    fake.mkdir()
    for binary in bin_dir.iterdir():
        (fake / binary.name).symlink_to(binary.resolve())
    (fake / "kubelet").unlink()
    (fake / "kubelet").write_text(BROKEN_KUBELET)
    (fake / "kubelet").chmod(0o755)
    before = hoststate.take()
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-m", "asrpool_harness.localcluster",
         "--bin-dir", str(fake), "--kubeconfig", str(tmp_path / "kubeconfig"),
         "--real-nodes", "1", "--ready-timeout", "15", "--workdir", str(tmp_path / "state"),
         "--pause-archive", archives[0]],
        capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 1
    assert "node-0 is not Ready" in result.stderr
    assert "broken on purpose by the test" in result.stderr
    assert hoststate.differences(before, hoststate.take()) == {}
