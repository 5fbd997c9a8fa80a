"""What a real-node cluster may change on the host while it runs, and must restore."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from asrpool_harness.localcluster import realnodes

Snapshot = dict[str, str]
COMMANDS = {
    "ip link": ["ip", "-o", "link"],
    "ip netns": ["ip", "netns", "list"],
    "ip route": ["ip", "route", "show", "table", "all"],
    "nft list ruleset": ["nft", "--stateless", "list", "ruleset"],
    "iptables-save": ["iptables-save"],
}


def take() -> Snapshot:
    state = {name: _run(argv) for name, argv in COMMANDS.items()}
    # Image builds (buildah, podman) mount and unmount in their own store meanwhile;
    # nothing of a cluster's mounts is there.
    state["/proc/mounts"] = "\n".join(
        line for line in Path("/proc/mounts").read_text().splitlines()
        if "/var/lib/containers/storage" not in line)
    for name in realnodes.MASKED_SYSCTLS:
        state[f"/proc/sys/{name}"] = Path("/proc/sys", name).read_text()
    state["cgroups"] = "\n".join(sorted(
        str(path) for path in Path("/sys/fs/cgroup").glob("*/asrpool-*")))
    return state


def _run(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    # iptables-save's comments carry a time stamp; link lines their changing counters.
    return "\n".join(line for line in out.splitlines() if not line.startswith("#"))


# Podman's own default network (bridge podman0, 10.88.0.0/16, NETAVARK chains, veths
# and netns-UUID namespaces) comes and goes while anyone runs a container on this host
# (image builds and their tests do). None of a cluster's names look like these: its
# links are asrp*, its namespaces asrpool-*, its addresses 198.18.0.0/15.
PODMAN = re.compile(r"podman\d|NETAVARK|10\.88\.|netns-[0-9a-f]{8}-|\bveth\d+\b")


def differences(before: Snapshot, after: Snapshot) -> dict[str, tuple[list[str], list[str]]]:
    """Per item: the lines gone and the lines added (podman's network's left out)."""
    found = {}
    for key in before.keys() | after.keys():
        old = {line for line in _lines(before.get(key, "")) if not PODMAN.search(line)}
        new = {line for line in _lines(after.get(key, "")) if not PODMAN.search(line)}
        if old != new:
            found[key] = (sorted(old - new), sorted(new - old))
    return found


def _lines(text: str) -> list[str]:
    return [re.sub(r"\s+", " ", line).strip() for line in text.splitlines() if line.strip()]
