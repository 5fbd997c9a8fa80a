"""One cgroup per real node, in every hierarchy this host mounts under /sys/fs/cgroup.

The node's programs (its containerd, and so every containerd-shim, its kubelet,
kube-proxy) are started in it, and its kubelet's ``cgroupRoot`` is it, so every
container lands below it too. Stopping the node kills whatever is in the tree, then
removes the tree bottom-up: nothing the node started can outlive it, double-forked
shims included.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
TRACKING = "pids"  # the hierarchy whose cgroup.procs a node's programs are put in
KILL_TIMEOUT = 15.0


def hierarchies(root: Path = ROOT) -> list[Path]:
    """Every cgroup hierarchy mounted under ``root`` (v1 controllers and unified)."""
    mounted = {line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
               if line.split()[2] in ("cgroup", "cgroup2")}
    return sorted(Path(path) for path in mounted if Path(path).parent == root)


class NodeCgroup:
    def __init__(self, name: str, root: Path = ROOT) -> None:
        self.name, self.root = name, root

    @property
    def path(self) -> str:
        """As the kubelet's ``cgroupRoot``."""
        return f"/{self.name}"

    @property
    def procs(self) -> Path:
        """The file a program writes its PID to, to join the node."""
        return self.root / TRACKING / self.name / "cgroup.procs"

    def create(self) -> None:
        for hierarchy in hierarchies(self.root):
            directory = hierarchy / self.name
            directory.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":  # a new cpuset has no CPUs until given some
                for key in ("cpuset.cpus", "cpuset.mems"):
                    (directory / key).write_text((hierarchy / key).read_text())

    def join(self) -> Path:
        """Move this process (all its threads) in; the tracking cgroup it was in."""
        before = own_cgroup()
        self.procs.write_text(str(os.getpid()))
        return before

    def pids(self) -> set[int]:
        found: set[int] = set()
        for hierarchy in hierarchies(self.root):
            for directory in _tree(hierarchy / self.name):
                with contextlib.suppress(OSError):
                    found.update(int(pid) for pid in (directory / "cgroup.procs")
                                 .read_text().split())
        return found

    def kill(self, timeout: float = KILL_TIMEOUT) -> None:
        """SIGKILL everything in the node until nothing is left (forks included)."""
        deadline = time.monotonic() + timeout
        while (pids := self.pids() - {os.getpid()}) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def remove(self) -> list[str]:
        """Remove the tree bottom-up in every hierarchy; what could not be removed."""
        left: list[str] = []
        for hierarchy in hierarchies(self.root):
            for directory in reversed(list(_tree(hierarchy / self.name))):
                for _ in range(50):
                    try:
                        directory.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.1)  # a killed process leaves its cgroup a moment later
                else:
                    left.append(str(directory))
        return left


def own_cgroup(root: Path = ROOT) -> Path:
    """The folder of this process's cgroup in the tracking hierarchy."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if TRACKING in controllers.split(","):
            return root / TRACKING / path.lstrip("/")
    raise RuntimeError(f"this host mounts no {TRACKING} cgroup hierarchy")


def return_to(directory: Path) -> None:
    (directory / "cgroup.procs").write_text(str(os.getpid()))


def _tree(top: Path) -> Iterator[Path]:
    """``top`` and its sub-cgroups, parents first."""
    if not top.is_dir():
        return
    yield top
    for child in sorted(top.iterdir()):
        if child.is_dir():
            yield from _tree(child)
