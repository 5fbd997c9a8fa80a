"""After the real-node cluster stops, the host is as it was before it started.

Named to run last in this folder: it stops the session's cluster.
"""

from __future__ import annotations

from tests.nodes import hoststate
from tests.nodes.clusters import NodeCluster
from tests.nodes.conftest import Running


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
