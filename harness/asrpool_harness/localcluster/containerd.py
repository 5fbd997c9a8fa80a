"""A node's own containerd: its root, state and socket under the node's folder.

CRI with runc (crun refuses this kind of VM's hybrid cgroups), cgroupfs, the node's CNI
configuration, the locally built pause image, no registry mirrors, and
``restrict_oom_score_adj`` (no CAP_SYS_RESOURCE here: a container's OOM score may not go
below containerd's own). The node's namespace has no route off the machine, so a pull
from anywhere but the cluster's own registry address (:data:`netns.REGISTRY`, plain
HTTP on the host's bridge, where a test may run a registry) can only fail; the other
tests set ``imagePullPolicy: Never``.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import IO

from asrpool.common import processes
from asrpool_harness.localcluster import cni, netns

# tools/images/build pause: its tag is the one Kubernetes' build/pause/Makefile gives.
PAUSE_IMAGE = "localhost/asrpool/pause:3.10.1"
NAMESPACE = "k8s.io"  # the CRI's containerd namespace
IMPORTED = re.compile(r"^unpacking (\S+) \(sha256:", re.MULTILINE)  # ctr images import
IMPORT_TIMEOUT = 1800.0  # the server image: gigabytes
RUNC = Path("/usr/sbin/runc")


SOCKETS = Path("/run/asrpool")  # in the node's mount namespace (a private tmpfs)


@dataclasses.dataclass(frozen=True)
class Paths:
    """Files under ``directory``; the socket in the node's own /run, where its path is
    short whatever the folder's (a unix socket's path has at most 104 bytes here)."""

    directory: Path
    holder: int  # the PID of the process holding the node's namespaces
    name: str = "containerd"

    @property
    def root(self) -> Path:
        return self.directory / "root"

    @property
    def state(self) -> Path:
        return self.directory / "state"

    @property
    def socket(self) -> Path:
        """As the node's programs see it."""
        return SOCKETS / f"{self.name}.sock"

    @property
    def host_socket(self) -> Path:
        """The same socket as the host sees it, through the holder's root."""
        return Path(f"/proc/{self.holder}/root") / self.socket.relative_to("/")

    @property
    def config(self) -> Path:
        return self.directory / "config.toml"

    @property
    def runc_root(self) -> Path:
        return self.directory / "runc"

    @property
    def registry_hosts(self) -> Path:
        """containerd's hosts folder: one ``HOST:PORT/hosts.toml`` per registry."""
        return self.directory / "certs.d"


def config(paths: Paths, cni_conf_dir: Path) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    runc = f'{cri}.containerd.runtimes.runc'
    return f"""version = 2
root = "{paths.root}"
state = "{paths.state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{paths.socket}"

[metrics]
  address = ""

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{runc}]
  runtime_type = "io.containerd.runc.v2"

[{runc}.options]
  BinaryName = "{RUNC}"
  Root = "{paths.runc_root}"
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{cni.PLUGINS_DIR}"
  conf_dir = "{cni_conf_dir}"
  max_conf_num = 1

[{cri}.registry]
  config_path = "{paths.registry_hosts}"
"""


def registry_hosts(address: str) -> str:
    """A registry at ``address`` spoken to in plain HTTP, for pulls."""
    return f"""server = "http://{address}"

[host."http://{address}"]
  capabilities = ["pull", "resolve"]
"""


def write(paths: Paths, cni_conf_dir: Path) -> None:
    paths.directory.mkdir(parents=True, exist_ok=True)
    paths.config.write_text(config(paths, cni_conf_dir))
    hosts = paths.registry_hosts / netns.REGISTRY
    hosts.mkdir(parents=True, exist_ok=True)
    (hosts / "hosts.toml").write_text(registry_hosts(netns.REGISTRY))


def ctr(paths: Paths, *args: str, timeout: float = 600.0, stdin: IO[bytes] | None = None) -> str:
    argv = ["ctr", "--address", str(paths.host_socket), "--namespace", NAMESPACE, *args]
    result = subprocess.run(argv, stdin=stdin, capture_output=True, text=True, check=False,
                            timeout=timeout)
    if result.returncode != 0:
        raise processes.StartError(f"ctr {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def answers(paths: Paths) -> bool:
    return paths.host_socket.exists() and bool(ctr(paths, "version", timeout=5.0))


def image_names(paths: Paths) -> set[str]:
    return set(ctr(paths, "images", "list", "--quiet").split())


def import_archive(paths: Paths, archive: Path) -> set[str]:
    """The archive's images, imported (blobs already in the store are kept as they are);
    the names it holds."""
    said = ctr(paths, "images", "import", str(archive), timeout=IMPORT_TIMEOUT)
    return set(IMPORTED.findall(said))


def import_layout(paths: Paths, layout: Path, leave_out: Collection[str] = ()) -> set[str]:
    """An OCI layout folder's images, imported from the archive of it that tar streams to
    ``ctr`` (none is written), without the files ``leave_out`` names (blobs of layers
    unpacked already); the names it holds."""
    entries = sorted(str(path.relative_to(layout)) for path in layout.rglob("*")
                     if path.is_file() and str(path.relative_to(layout)) not in leave_out)
    with tempfile.TemporaryFile() as problems:
        with subprocess.Popen(["tar", "-C", str(layout), "-cf", "-", *entries],
                              stdout=subprocess.PIPE, stderr=problems) as tar:
            said = ctr(paths, "images", "import", "-", timeout=IMPORT_TIMEOUT, stdin=tar.stdout)
        if tar.returncode != 0:
            problems.seek(0)
            raise processes.StartError(
                f"tar of {layout}: {problems.read().decode(errors='replace').strip()}")
    return set(IMPORTED.findall(said))


def rename(paths: Paths, name: str, to: str) -> None:
    """The image ``name`` takes the name ``to`` (from the image that had it) and loses
    its own."""
    ctr(paths, "images", "tag", "--force", name, to)
    ctr(paths, "images", "rm", name)


def snapshots(paths: Paths, snapshotter: str = "overlayfs") -> set[str]:
    """The names of the committed snapshots: the chain IDs of the layers unpacked."""
    said = ctr(paths, "snapshots", "--snapshotter", snapshotter, "ls")
    return {line.split()[0] for line in said.splitlines()[1:]
            if line.split() and line.split()[-1] == "Committed"}


def keep_only(paths: Paths, names: set[str]) -> None:
    """Remove every other image, and (synchronously) the blobs only they used."""
    others = sorted(image_names(paths) - names)
    if others:
        ctr(paths, "images", "rm", "--sync", *others)
