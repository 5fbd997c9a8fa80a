"""A node's CNI network: a bridge in the node's namespace, host-local addresses.

Pods get addresses from their node's pod range, their default route to the node's
bridge (the node has none further: nothing leaves the machine), and no masquerade: a
pod's packets keep its address, routed between nodes over the host bridge.
"""

from __future__ import annotations

import json
from pathlib import Path

from asrpool_harness.localcluster import netns

PLUGINS_DIR = Path("/usr/lib/cni")
PLUGINS = ("bridge", "host-local", "loopback")
NETWORK_NAME = "asrpool"


def conflist(node: netns.NodeNet, ipam_dir: Path) -> str:
    return json.dumps({
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": True,
            "ipMasq": False,
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": node.pod_network, "gateway": node.pod_gateway}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": str(ipam_dir),
            },
        }],
    }, indent=2)


def write(node: netns.NodeNet, directory: Path) -> Path:
    """The node's configuration folder (containerd's ``conf_dir``), written."""
    conf_dir = directory / "net.d"
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "10-asrpool.conflist").write_text(conflist(node, directory / "ipam"))
    return conf_dir
