"""Real nodes: containerd, kubelet and kube-proxy per node, in the node's namespaces.

Each node has a network namespace (:mod:`netns`) and a mount namespace, held by one
"holder" process, that its containerd, kubelet and kube-proxy all enter, so the kubelet's
volume mounts are the ones containerd's containers see. In that mount namespace:

- private tmpfs over /run, /var/lib and /var/log, so what the kubelet and containerd
  write at fixed host paths (shim sockets, pod network namespaces, CNI's cache,
  /var/log/containers) stays with the node and goes with it;
- the kernel settings the kubelet writes on start (``vm.overcommit_memory``,
  ``kernel.panic``, ``kernel.panic_on_oops`` and the three others of its list) masked
  by files holding their current values, so the host's never change.

Every process of the node runs in the node's cgroup (:mod:`cgroups`), which the stop
kills and removes; then the namespaces and the bridge go. iptables rules the kubelet
adds and kube-proxy's nftables live in the node's network namespace and go with it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path

from asrpool.common import processes
from asrpool_harness.localcluster import (
    cgroups,
    clusterdns,
    cni,
    containerd,
    controlplane,
    diskspace,
    imagecache,
    images,
    kubelets,
    netns,
)

STOP_TIMEOUT = 10.0
START_TIMEOUT = 60.0
MASKED_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                  "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                  "kernel/keys/root_maxbytes")
# A missing program, and the Debian package that has it.
TOOLS = {"containerd": "containerd", "ctr": "containerd", "runc": "runc",
         "nft": "nftables", "iptables": "iptables", "conntrack": "conntrack",
         "ip": "iproute2", "nsenter": "util-linux", "unshare": "util-linux",
         "mount": "mount"}

HOLDER = r"""
set -e
echo $$ > "$1"
ready=$2
shift 2
for dir in /run /var/lib /var/log; do mount -t tmpfs -o mode=755 asrpool-node "$dir"; done
mkdir -p /run/netns /run/lock /run/asrpool
while [ $# -gt 0 ]; do mount --bind "$1" "/proc/sys/$2"; shift 2; done
touch "$ready"
exec sleep infinity
"""

ENTER = r"""
echo $$ > "$1"
target=$2
shift 2
exec nsenter --target "$target" --mount --net -- "$@"
"""


BRIDGE_NETFILTER = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


PROXY_USER = "system:kube-proxy"


def node_user(name: str) -> str:
    """A node's identity, as the Node authorizer and NodeRestriction know it."""
    return f"system:node:{name}"


def missing_tool() -> str | None:
    """One line naming the first missing program and its Debian package (or the
    kernel's missing ``br_netfilter``, which Service replies between pods on one bridge
    need: :mod:`kubelets`), or None."""
    if not BRIDGE_NETFILTER.exists():
        return ("the kernel has no br_netfilter (no /proc/sys/net/bridge): "
                "run 'modprobe br_netfilter' as root")
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"no {tool} on PATH (Debian package {package})"
    for plugin in cni.PLUGINS:
        if not (cni.PLUGINS_DIR / plugin).exists():
            return (f"no CNI plugin {cni.PLUGINS_DIR / plugin} "
                    "(Debian package containernetworking-plugins)")
    return None


def cluster_id(pid: int) -> str:
    """A cluster's name: its owner's PID in hex, so a cluster whose owner was killed
    (SIGKILL leaves no time to stop) is known as stale by the next one."""
    return f"{pid:x}"


def stale_clusters() -> set[str]:
    """Clusters with namespaces, bridges or cgroups left behind and no live owner."""
    found = {path.name.split("-")[1] for path in netns.NETNS_DIR.glob("asrpool-*-node-*")}
    found |= {path.name.removeprefix("asrpbr-")
              for path in Path("/sys/class/net").glob("asrpbr-*")}
    for hierarchy in cgroups.hierarchies():
        found |= {path.name.split("-")[1] for path in hierarchy.glob("asrpool-*-node-*")}
        found |= {path.name.split("-")[1] for path in hierarchy.glob("asrpool-*-plane")}
    return {cluster for cluster in found if not _owner_alive(cluster)}


def plane_cgroup(cluster: str) -> str:
    """The cgroup of ``up`` itself and so of the control plane and CoreDNS it starts:
    what a killed owner leaves running there is killed with its nodes."""
    return f"asrpool-{cluster}-plane"


def _owner_alive(cluster: str) -> bool:
    try:
        cmdline = Path(f"/proc/{int(cluster, 16)}/cmdline").read_bytes()
    except (ValueError, OSError):
        return False
    return b"asrpool_harness.localcluster" in cmdline


def clean(cluster: str) -> list[str]:
    """Kill and remove what a stale cluster left; what could not be removed."""
    indices = {int(path.name.rsplit("-", 1)[1])
               for path in [*netns.NETNS_DIR.glob(f"asrpool-{cluster}-node-*"),
                            *(path for hierarchy in cgroups.hierarchies()
                              for path in hierarchy.glob(f"asrpool-{cluster}-node-*"))]}
    left: list[str] = []
    names = [netns.NodeNet(cluster, index).namespace for index in sorted(indices)]
    for name in [plane_cgroup(cluster), *names]:
        cgroup = cgroups.NodeCgroup(name)
        cgroup.kill()
        left += cgroup.remove()
    net = netns.ClusterNet(cluster, tuple(netns.NodeNet(cluster, i) for i in sorted(indices)))
    return left + netns.remove(net)


@dataclasses.dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    kube_proxy: Path
    coredns: Path

    @classmethod
    def find(cls, bin_dir: Path) -> NodeBinaries:
        found = cls(bin_dir / "kubelet", bin_dir / "kube-proxy", bin_dir / "coredns")
        missing = [str(path) for path in dataclasses.astuple(found) if not path.exists()]
        if missing:
            raise processes.StartError(
                f"missing {', '.join(missing)}: run tools/cluster/build first")
        return found


class RealNode:
    def __init__(self, net: netns.NodeNet, binaries: NodeBinaries, workdir: Path) -> None:
        self.net, self.binaries = net, binaries
        self.name = f"node-{net.index}"
        self.directory = workdir / self.name
        self.cgroup = cgroups.NodeCgroup(net.namespace)
        self.runtime_dir = self.directory / "containerd"
        self.children: list[processes.Child] = []
        self.holder: processes.Child | None = None

    def log(self, program: str) -> Path:
        return self.directory / "logs" / f"{program}.log"

    def start_namespaces(self) -> None:
        """The node's cgroup made, its network and mount namespaces held."""
        self.cgroup.create()
        self._start_holder()

    @property
    def runtime(self) -> containerd.Paths:
        assert self.holder is not None
        return containerd.Paths(self.runtime_dir, self.holder.process.pid)

    def start_runtime(self, seed_root: Path) -> None:
        """The node's containerd, from a copy of the seed's images, answering."""
        imagecache.copy(seed_root, self.runtime.root)
        conf_dir = cni.write(self.net, self.directory / "cni")
        self._start_containerd(self.runtime, conf_dir)

    def _start_containerd(self, paths: containerd.Paths, conf_dir: Path) -> processes.Child:
        containerd.write(paths, conf_dir)
        child = self._enter("containerd", ["containerd", "--config", str(paths.config)])
        processes.wait_until(lambda: containerd.answers(paths), START_TIMEOUT,
                             f"{self.name}'s containerd", [child])
        return child

    def fill_seed(self, wanted: Sequence[images.Image]) -> Callable[[Path], None]:
        """What imports ``wanted`` into a seed root under a folder, in this node (a
        stored image goes through an OCI layout folder there, removed once imported,
        which holds only the layers the seed has not unpacked yet)."""
        def fill(directory: Path) -> None:
            assert self.holder is not None
            paths = containerd.Paths(directory, self.holder.process.pid, "seed")
            child = self._start_containerd(paths, cni.write(self.net, directory / "cni"))
            try:
                names: set[str] = set()
                for image in wanted:
                    if not image.stored:
                        names |= containerd.import_archive(paths, Path(image.name))
                        continue
                    with images.layout(image, directory / "export",
                                       containerd.snapshots(paths)) as layout:
                        names |= containerd.import_layout(paths, layout.folder,
                                                          layout.stand_ins)
                    if layout.name != image.name:
                        containerd.rename(paths, layout.name, image.name)
                        names = names - {layout.name} | {image.name}
                containerd.keep_only(paths, names)  # a previous seed's other images
            finally:
                child.stop(STOP_TIMEOUT)
                self.children.remove(child)
            for leftover in (paths.state, paths.runc_root, directory / "cni", directory / "export"):
                shutil.rmtree(leftover, ignore_errors=True)
        return fill

    def _start_holder(self) -> None:
        ready = self.directory / "holder.ready"
        ready.unlink(missing_ok=True)
        masks: list[str] = []
        for name in MASKED_SYSCTLS:
            copy = self.directory / "sysctl" / name.replace("/", ".")
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(Path("/proc/sys", name).read_text())
            masks += [str(copy), name]
        self.holder = processes.spawn(f"{self.name} holder", [
            "nsenter", f"--net={self.net.namespace_path}", "--",
            "unshare", "--mount", "--propagation", "slave", "--",
            "sh", "-c", HOLDER, "holder", str(self.cgroup.procs), str(ready), *masks],
            self.log("holder"))
        processes.wait_until(ready.exists, START_TIMEOUT, f"{self.name}'s namespaces",
                             [self.holder])

    def _enter(self, program: str, argv: Sequence[str]) -> processes.Child:
        """``argv`` in the node's cgroup and namespaces, its output in its log."""
        assert self.holder is not None
        child = processes.spawn(f"{self.name} {program}", [
            "sh", "-c", ENTER, program, str(self.cgroup.procs), str(self.holder.process.pid),
            *argv], self.log(program))
        self.children.append(child)
        return child

    def start_kubelet(self, kubeconfig: Path, proxy_kubeconfig: Path,
                      cluster_dns: str, client_ca: Path) -> None:
        """The kubelet as ``system:node:NAME`` (``kubeconfig``), its API serving the
        clients the API server vouches for (certificates of ``client_ca``, or tokens);
        kube-proxy as ``system:kube-proxy``."""
        resolv = self.directory / "resolv.conf"
        resolv.write_text(f"nameserver {cluster_dns}\n")
        config = kubelets.write(self.directory / "kubelet.yaml", kubelets.kubelet_config(
            self.net, cgroup_root=self.cgroup.path, runtime_socket=self.runtime.socket,
            cluster_dns=cluster_dns, resolv_conf=resolv, pod_logs=self.directory / "pods",
            client_ca=client_ca))
        self._enter("kubelet", [
            str(self.binaries.kubelet), "--config", str(config), "--kubeconfig", str(kubeconfig),
            "--root-dir", str(self.directory / "kubelet"), "--hostname-override", self.name,
            "--node-ip", self.net.address, "--v", "1"])
        proxy = kubelets.write(self.directory / "kube-proxy.yaml",
                               kubelets.kube_proxy_config(self.net, proxy_kubeconfig))
        self._enter("kube-proxy", [str(self.binaries.kube_proxy), "--config", str(proxy),
                                   "--v", "1"])

    def check_alive(self) -> None:
        for child in [*self.children, *([self.holder] if self.holder else [])]:
            child.check_alive()

    def last_lines(self, program: str = "kubelet", count: int = 5) -> str:
        try:
            lines = self.log(program).read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-count:])

    def stop(self) -> list[str]:
        """Stop the programs, kill what is left in the cgroup, remove it; what is left."""
        for child in reversed(self.children):
            child.stop(STOP_TIMEOUT)
        self.children.clear()
        self.cgroup.kill()
        if self.holder is not None:
            root = self.runtime.root
            self.holder.stop(STOP_TIMEOUT)
            self.holder = None
            # A hard-linked copy of the seed: kept in a folder that outlives the cluster
            # (--workdir, a test's), it would hold the seed's gigabytes on disk after
            # imagecache replaced the seed. Its mounts went with the holder.
            shutil.rmtree(root, ignore_errors=True)
        return self.cgroup.remove()


class RealNodes:
    """The network, the cluster DNS and every node; started in that order."""

    def __init__(self, bin_dir: Path, workdir: Path, count: int, cluster: str,
                 image_cache: Path) -> None:
        self.binaries = NodeBinaries.find(bin_dir)
        self.image_cache = image_cache
        self.kubectl = bin_dir / "kubectl"
        self.workdir = workdir
        self.net = netns.ClusterNet.plan(cluster, count)
        self.nodes = [RealNode(node, self.binaries, workdir) for node in self.net.nodes]
        self.dns: processes.Child | None = None
        self.kubeconfig: Path | None = None
        self.plane = cgroups.NodeCgroup(plane_cgroup(cluster))
        self.came_from: Path | None = None
        self.mounted_netns_dir = False  # by this cluster (netns.create), to undo on stop

    @property
    def address(self) -> str:
        """Where the API server listens: the host's address on the nodes' bridge."""
        return netns.HOST_ADDRESS

    @property
    def identities(self) -> dict[str, str]:
        """Who the nodes' programs are (the control plane gives each a token): every
        kubelet its own node, kube-proxy the user Kubernetes' default RBAC binds to
        ``system:node-proxier``."""
        return {node_user(node.name): "system:nodes" for node in self.nodes} | {PROXY_USER: ""}

    def create_network(self) -> None:
        for cluster in stale_clusters():
            problems = clean(cluster)
            if problems:
                raise processes.StartError(
                    f"a stale real-node cluster ({cluster}) could not be removed: {problems}")
        self.plane.create()
        self.came_from = self.plane.join()
        self.mounted_netns_dir = netns.create(self.net)

    def start(self, access: controlplane.Access, wanted: Sequence[images.Image]) -> float:
        """DNS and every node's runtime, images and kubelet; the seconds the images took
        (to import them into a new seed, or to find it)."""
        self._check_disk(wanted)
        self.kubeconfig = self.workdir / "node.kubeconfig"
        self.kubeconfig.write_text(access.kubeconfig())
        self.dns = clusterdns.start(self.binaries.coredns, netns.HOST_ADDRESS,
                                    self.kubeconfig, self.workdir)
        clusterdns.publish(self.kubectl, self.kubeconfig, netns.HOST_ADDRESS)
        with futures.ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda node: node.start_namespaces(), self.nodes))
            began = time.monotonic()
            seed = imagecache.ensure(self.image_cache, wanted,
                                     self.nodes[0].fill_seed(wanted))
            loaded = time.monotonic() - began
            list(pool.map(lambda node: node.start_runtime(seed), self.nodes))
        proxy = self.workdir / "kube-proxy.kubeconfig"
        proxy.write_text(access.kubeconfig_of(PROXY_USER))
        for node in self.nodes:
            kubelet = node.directory / "kubelet.kubeconfig"
            kubelet.write_text(access.kubeconfig_of(node_user(node.name)))
            node.start_kubelet(kubelet, proxy, controlplane.DNS_SERVICE_IP, access.ca_cert)
        return loaded

    def _check_disk(self, wanted: Sequence[images.Image]) -> None:
        new, first = imagecache.to_import(self.image_cache, wanted)
        self.image_cache.mkdir(parents=True, exist_ok=True)
        problem = diskspace.problem(self.image_cache, sum(map(images.size, new)), first)
        if problem is not None:
            raise processes.StartError(problem)

    def ready(self) -> bool:
        for node in self.nodes:
            node.check_alive()
        if self.dns is not None:
            self.dns.check_alive()
        return self.ready_names() >= {node.name for node in self.nodes}

    def ready_names(self) -> set[str]:
        assert self.kubeconfig is not None
        result = subprocess.run(
            [str(self.kubectl), "--kubeconfig", str(self.kubeconfig), "get", "nodes",
             "-o", "json"], capture_output=True, text=True, check=False, timeout=30)
        if result.returncode != 0:
            return set()
        return {item["metadata"]["name"] for item in json.loads(result.stdout)["items"]
                if any(condition["type"] == "Ready" and condition["status"] == "True"
                       for condition in item["status"].get("conditions", []))}

    def why_not_ready(self) -> str:
        ready = self.ready_names() if self.kubeconfig else set()
        return "; ".join(f"{node.name} is not Ready, its kubelet's last lines:\n"
                         f"{node.last_lines()}" for node in self.nodes
                         if node.name not in ready)

    def check_alive(self) -> None:
        for node in self.nodes:
            node.check_alive()
        if self.dns is not None:
            self.dns.check_alive()

    def stop(self) -> list[str]:
        """Every node, then the DNS; what could not be removed."""
        left: list[str] = []
        for node in self.nodes:
            left += node.stop()
        if self.dns is not None:
            self.dns.stop(STOP_TIMEOUT)
            self.dns = None
        return left

    def remove_network(self) -> list[str]:
        """The network, then this process back where it was and the plane's cgroup
        removed (anything still in it killed first)."""
        left = netns.remove(self.net, self.mounted_netns_dir)
        if self.came_from is not None:
            cgroups.return_to(self.came_from)
            self.came_from = None
        self.plane.kill()
        return left + self.plane.remove()
