"""The network of real nodes: a host bridge, one network namespace per node, routes.

Every address is in the benchmarking range 198.18.0.0/15 (RFC 2544) and lives only on
links this module creates:

- the host bridge ``asrpbr-<id>`` has 198.18.0.1/24 (the API server and the cluster DNS
  listen there);
- node ``i`` is the network namespace ``asrpool-<id>-node-<i>``, joined to the bridge by
  a veth pair, with 198.18.0.(10+i) on its ``eth0`` and pods in 198.18.(16+i).0/24;
- each node routes the other nodes' pod ranges to their nodes over the bridge, and the
  host routes them too (through the bridge: its replies to pods). No node has a default
  route, so nothing a pod sends can leave the machine, and no host sysctl changes: a
  node forwards with its own namespace's ``net.ipv4.ip_forward`` and passes its bridged
  packets to netfilter with its own ``net.bridge.bridge-nf-call-iptables``.

Removing the namespaces and the bridge removes every link and route with them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from asrpool.common import processes

HOST_ADDRESS = "198.18.0.1"
# Where the nodes pull images from, in plain HTTP, when a registry listens there
# (containerd.registry_hosts).
REGISTRY = f"{HOST_ADDRESS}:5000"
NODE_NETWORK = "198.18.0.0/24"
POD_NETWORKS = "198.18.16.0/20"  # every node's pod range, for kube-proxy's clusterCIDR
MAX_NODES = 16
NETNS_DIR = Path("/run/netns")


@dataclasses.dataclass(frozen=True)
class NodeNet:
    cluster: str
    index: int

    @property
    def namespace(self) -> str:
        return f"asrpool-{self.cluster}-node-{self.index}"

    @property
    def namespace_path(self) -> Path:
        return NETNS_DIR / self.namespace

    @property
    def host_link(self) -> str:
        return f"asrp{self.cluster}n{self.index}"

    @property
    def address(self) -> str:
        return f"198.18.0.{10 + self.index}"

    @property
    def pod_network(self) -> str:
        return f"198.18.{16 + self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        return f"198.18.{16 + self.index}.1"


@dataclasses.dataclass(frozen=True)
class ClusterNet:
    cluster: str
    nodes: tuple[NodeNet, ...]

    @classmethod
    def plan(cls, cluster: str, count: int) -> ClusterNet:
        if not 1 <= count <= MAX_NODES:
            raise processes.StartError(f"real nodes: 1..{MAX_NODES}, not {count}")
        return cls(cluster, tuple(NodeNet(cluster, i) for i in range(count)))

    @property
    def bridge(self) -> str:
        return f"asrpbr-{self.cluster}"


def ip(*args: str, namespace: str | None = None) -> str:
    """``ip ARGS`` on the host or inside ``namespace``; its output, or a StartError."""
    argv = ["ip", *(["-n", namespace] if namespace else []), *args]
    return _run(argv)


def _run(argv: Sequence[str]) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise processes.StartError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result.stdout


def check_free(net: ClusterNet) -> None:
    """Fail if another cluster (or anything else) already uses the range."""
    routes = ip("-4", "route", "show", "table", "all")
    taken = ipaddress.ip_network("198.18.0.0/15")
    for line in routes.splitlines():
        target = line.split()[0] if line.strip() else ""
        if target in ("default", "local", "broadcast", "unreachable", "blackhole"):
            target = line.split()[1] if len(line.split()) > 1 else ""
        try:
            network = ipaddress.ip_network(target, strict=False)
        except ValueError:
            continue
        if network.version == 4 and network.prefixlen > 0 and network.overlaps(taken):
            raise processes.StartError(
                f"198.18.0.0/15 is in use on this host already ({line.strip()}): "
                "is another real-node cluster running?")


def create(net: ClusterNet) -> bool:
    """The bridge, then every node's namespace, link, address and routes. Says whether
    /run/netns became a mount point meanwhile (iproute2's first ``ip netns add`` on a
    host bind-mounts it on itself), for :func:`remove` to undo."""
    check_free(net)
    mounted_before = netns_dir_mounted()
    ip("link", "add", net.bridge, "type", "bridge")
    _write(Path(f"/proc/sys/net/ipv6/conf/{net.bridge}/disable_ipv6"), "1")
    ip("addr", "add", f"{HOST_ADDRESS}/24", "dev", net.bridge)
    ip("link", "set", net.bridge, "up")
    for node in net.nodes:
        _create_node(net, node)
    for node in net.nodes:
        ip("route", "add", node.pod_network, "via", node.address, "dev", net.bridge)
    return not mounted_before and netns_dir_mounted()


def netns_dir_mounted() -> bool:
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    return any(line.split()[1:2] == [str(NETNS_DIR)] for line in mounts)


def _create_node(net: ClusterNet, node: NodeNet) -> None:
    ip("netns", "add", node.namespace)
    ip("link", "add", node.host_link, "type", "veth", "peer", "name", "eth0",
       "netns", node.namespace)
    _write(Path(f"/proc/sys/net/ipv6/conf/{node.host_link}/disable_ipv6"), "1")
    ip("link", "set", node.host_link, "master", net.bridge, "up")
    ns = node.namespace
    ip("addr", "add", f"{node.address}/24", "dev", "eth0", namespace=ns)
    ip("link", "set", "lo", "up", namespace=ns)
    ip("link", "set", "eth0", "up", namespace=ns)
    for other in net.nodes:
        if other != node:
            ip("route", "add", other.pod_network, "via", other.address, "dev", "eth0",
               namespace=ns)
    # Bridged packets between a node's pods cross its netfilter hooks (conntrack un-NATs
    # a Service's replies; the NetworkPolicy enforcer sees them): the default, made sure.
    _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1",
          "net.bridge.bridge-nf-call-iptables=1"])


def remove(net: ClusterNet, netns_dir_mount: bool = False) -> list[str]:
    """Remove what :func:`create` made (whatever of it exists), the mount of /run/netns
    too if it made that and nothing else holds a namespace there; the errors, if any."""
    errors: list[str] = []
    for node in net.nodes:
        if node.namespace_path.exists():
            _collect(errors, ["ip", "netns", "del", node.namespace])
        # Its veth pair goes with the namespace, a moment later.
        if _still_there(node.host_link):
            _collect(errors, ["ip", "link", "del", node.host_link])
    if Path(f"/sys/class/net/{net.bridge}").exists():
        _collect(errors, ["ip", "link", "del", net.bridge])
    if netns_dir_mount and netns_dir_mounted() and not any(NETNS_DIR.iterdir()):
        _collect(errors, ["umount", str(NETNS_DIR)])
    return errors


def _still_there(link: str, wait: float = 2.0) -> bool:
    deadline = time.monotonic() + wait
    while Path(f"/sys/class/net/{link}").exists():
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


def _collect(errors: list[str], argv: list[str]) -> None:
    try:
        _run(argv)
    except processes.StartError as exc:
        errors.append(str(exc))


def _write(path: Path, value: str) -> None:
    path.write_text(value)
