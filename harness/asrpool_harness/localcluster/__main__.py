"""``python -m asrpool_harness.localcluster --kubeconfig FILE [--nodes N] [--gpus-per-node G]``
or ``... --real-nodes N [--images ARCHIVE_OR_DIR_OR_NAME...]``.

Starts the control plane and the node agent (or N real nodes: :mod:`realnodes`), writes
an admin kubeconfig to FILE, prints ``ready`` once every node is Ready, and on SIGINT or
SIGTERM stops everything (pods first, then the scheduler, the controllers, the API
server and etcd) and removes its files. ``tools/cluster/up`` builds the binaries first
and runs this.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from asrpool.common import processes
from asrpool_harness.localcluster import agent, controlplane, imagecache, images, nodes, realnodes

READY_TIMEOUT = 120.0
REAL_READY_TIMEOUT = 180.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tools/cluster/up",
        description="A real Kubernetes control plane on loopback, with local nodes.")
    parser.add_argument("--kubeconfig", required=True, type=Path,
                        help="where to write the admin kubeconfig")
    parser.add_argument("--nodes", type=int, default=1, help="how many nodes (default 1)")
    parser.add_argument("--gpus-per-node", type=int, default=0,
                        help="allocatable nvidia.com/gpu of each node (default 0)")
    parser.add_argument("--bin-dir", type=Path, required=True,
                        help="the folder of the binaries tools/cluster/build made")
    parser.add_argument("--exit-with-parent", action="store_true",
                        help="stop everything when the process that started this one dies"
                        " (a test run killed before its teardown leaves no cluster behind)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep files (logs, etcd, pods) here instead of a temporary folder")
    parser.add_argument("--real-nodes", type=int, default=0, metavar="N",
                        help="N real nodes (kubelet, containerd, kube-proxy in network "
                        "namespaces) instead of the node agent's")
    parser.add_argument("--images", nargs="*", default=[], metavar="IMAGE",
                        help="with --real-nodes: OCI archives, folders of them, or image "
                        "names in podman's storage, loaded into every node")
    parser.add_argument("--pause-archive", type=Path, default=None,
                        help="with --real-nodes: the pause image's OCI archive "
                        "(tools/cluster/node-images)")
    parser.add_argument("--ready-timeout", type=float, default=REAL_READY_TIMEOUT,
                        help="with --real-nodes: seconds the nodes have to become Ready "
                        f"(default {REAL_READY_TIMEOUT:.0f})")
    parser.add_argument("--image-cache", type=Path, default=None,
                        help="with --real-nodes: where containerd roots with the images "
                        "loaded are kept (default: ~/.cache/asrpool/containerd-seeds)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 1 <= args.nodes <= 200 or args.gpus_per_node < 0:
        print("tools/cluster/up: --nodes must be 1..200 and --gpus-per-node at least 0",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    _on_signals(stop)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="asrpool-cluster-"))
    if args.real_nodes:
        return _run_real(args, stop, workdir)
    shapes = [nodes.NodeShape(f"node-{i}", i, args.gpus_per_node) for i in range(args.nodes)]
    plane: controlplane.ControlPlane | None = None
    node_agent: agent.NodeAgent | None = None
    failed = False
    try:
        plane = controlplane.ControlPlane(controlplane.Binaries.find(args.bin_dir), workdir)
        access = plane.start()
        args.kubeconfig.write_text(access.kubeconfig())
        node_agent = agent.NodeAgent(access, shapes, workdir)
        node_agent.start()
        processes.wait_until(node_agent.nodes_ready, READY_TIMEOUT, "the nodes")
        print("ready", flush=True)
        _serve(args, stop, [plane.check_alive])
    except processes.StartError as exc:
        failed = True
        print(f"tools/cluster/up: {exc} (logs kept: {workdir / 'logs'})", file=sys.stderr)
        return 1
    finally:
        _block_signals()
        if node_agent is not None:
            node_agent.stop()
        if plane is not None:
            plane.stop()
        if args.workdir is None and not failed:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _run_real(args: argparse.Namespace, stop: threading.Event, workdir: Path) -> int:
    """The control plane with real nodes; the host left as found when it stops."""
    problem = realnodes.missing_tool()
    if problem is not None:
        print(f"tools/cluster/up: {problem}", file=sys.stderr)
        return 1
    workdir.mkdir(parents=True, exist_ok=True)
    workdir = workdir.resolve()
    real: realnodes.RealNodes | None = None
    plane: controlplane.ControlPlane | None = None
    failed = False
    try:
        seeds = args.image_cache or imagecache.default_dir()
        # Earlier versions kept an OCI archive of each stored image here (the server's:
        # gigabytes); images are now copied out only to fill a seed, and not kept.
        shutil.rmtree(seeds.parent / "oci-from-podman", ignore_errors=True)
        wanted = images.resolve([*([str(args.pause_archive)] if args.pause_archive else []),
                                 *args.images])
        real = realnodes.RealNodes(args.bin_dir, workdir, args.real_nodes,
                                   realnodes.cluster_id(os.getpid()),
                                   seeds)
        real.create_network()
        plane = controlplane.ControlPlane(controlplane.Binaries.find(args.bin_dir), workdir,
                                          real.address, real.identities)
        access = plane.start()
        args.kubeconfig.write_text(access.kubeconfig())
        loaded = real.start(access, wanted)
        print(f"images ready for {args.real_nodes} node(s) in {loaded:.1f} s", file=sys.stderr)
        _wait_ready(real, args.ready_timeout)
        print("ready", flush=True)
        _serve(args, stop, [plane.check_alive, real.check_alive])
    except processes.StartError as exc:
        failed = True
        print(f"tools/cluster/up: {exc} (logs kept: {workdir})", file=sys.stderr)
        return 1
    finally:
        _block_signals()
        left = real.stop() if real is not None else []
        if plane is not None:
            plane.stop()
        left += real.remove_network() if real is not None else []
        for problem in left:
            print(f"tools/cluster/up: could not remove {problem}", file=sys.stderr)
        if args.workdir is None and not failed:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _wait_ready(real: realnodes.RealNodes, timeout: float) -> None:
    try:
        processes.wait_until(real.ready, timeout, "the real nodes", period=1.0)
    except processes.StartError as exc:
        raise processes.StartError(f"{exc}: {real.why_not_ready()}") from exc


def _serve(args: argparse.Namespace, stop: threading.Event,
           checks: Sequence[Callable[[], None]]) -> None:
    parent = os.getppid()
    while not stop.wait(1.0):
        for check in checks:
            check()
        if args.exit_with_parent and os.getppid() != parent:
            break


def _on_signals(stop: threading.Event) -> None:
    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handle)


def _block_signals() -> None:
    """A second signal while stopping must not cut the stop short."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


if __name__ == "__main__":
    sys.exit(main())
