"""docs/production.md followed on real nodes: every step's commands run as written, in
the guide's order, each step timed.

What stands in here for what a reader brings of their own:

- their registry: a real one (distribution's ``docker-registry``) on the cluster's
  bridge, served without TLS; skopeo pushes the chart's images to it and the nodes'
  containerd pulls them from it (it stands for ``registry.example``);
- the Hugging Face Hub: a mirror the pool reaches by ``HF_ENDPOINT`` (a stand-in,
  tests/support/hubs.py, serving a random tiny checkpoint in the real layout);
- a GPU node pool: one of the two real nodes, labelled and tainted as GKE labels and
  taints its H100 nodes;
- the Prometheus Operator: its CRDs (tools/cluster/user-tools), with no operator to
  read them;
- their local port for step 7's port-forward: a free one;
- the edits step 6 asks of the example pool (:func:`edited_example`): the mirror's
  model, an image the nodes hold, and what no GPU means here (no GPU asked, no NVIDIA
  runtime class, two slots on two cores, CPU's dtype).

What does not run here (``SKIPPED``, each with its reason): Docker's builds, copying
the server image (gigabytes; the nodes hold it already), streaming through an Ingress
(no controller; its object and the pool's ``status.url`` are checked instead).

The steps' times go to the file ``ASRPOOL_GUIDE_TIMES`` names, when set (JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from asrpool.common import processes
from asrpool.operator import sources
from asrpool_harness.localcluster import netns
from tests.nodes import test_chart
from tests.nodes.clusters import NodeCluster
from tests.support import hubs, imagebuilds, registries
from tests.support.polling import eventually

pytestmark = pytest.mark.timeout(2400)
ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "production.md"
EXAMPLE = "crds/examples/production.yaml"
USER_TOOLS = ROOT / "tools" / "cluster" / "user-tools"
SERVER_IMAGE = "ghcr.io/asrpool/asrpool:0.1.0"  # in the nodes (tests/nodes/conftest.py)
MIRRORED_REPO = "acme/stt-tiny"
NAMESPACES = ("asrpool-system", "speech")
GPU_LABEL = ("cloud.google.com/gke-accelerator", "nvidia-h100-80gb")  # the example's
GPU_TAINT = "nvidia.com/gpu=present:NoSchedule"
NODE_CACHE = Path(sources.NODE_CACHE_ROOT)
BLOCK_TIMEOUT = 900.0
STEP_HEADING = re.compile(r"^## (\d+)\. (.+)$", re.MULTILINE)
BASH = re.compile(r"```bash\n(.*?)```", re.DOTALL)

# Commands not run here, by how they start, and why.
SKIPPED = {
    "docker ": "no Docker daemon here: tools/images/build builds the same images",
    "skopeo copy containers-storage:ghcr.io/asrpool/asrpool:0.1.0":
        "the server image is gigabytes of torch and the nodes hold it already: the pool "
        "names it there",
    '.venv/bin/asrpool stream "$URL"':
        "no Ingress controller runs here and asr.example.com resolves nowhere: the "
        "Ingress object and the pool's status.url are checked instead",
}
# A watch the reader ends by hand becomes a wait for what they watch for.
REWRITES = {
    "kubectl get asrpool -n speech -w":
        "kubectl wait asrpool/stt-en -n speech --for=condition=Ready --timeout=900s",
}


@dataclasses.dataclass(frozen=True)
class Step:
    number: int
    title: str
    blocks: tuple[str, ...]


def guide_steps() -> list[Step]:
    text = GUIDE.read_text()
    headings = list(STEP_HEADING.finditer(text))
    ends = [h.start() for h in headings[1:]] + [len(text)]
    return [Step(int(h.group(1)), h.group(2), tuple(BASH.findall(text, h.end(), end)))
            for h, end in zip(headings, ends, strict=True)]


def commands(block: str) -> list[str]:
    """The block's commands, each with its continuation lines."""
    joined = block.replace("\\\n", "\\\n\0")
    return [line.replace("\0", "") for line in re.split(r"(?<!\\)\n", joined)
            if line.strip()]


def runnable(block: str, placeholders: dict[str, str]) -> tuple[str, list[str]]:
    """The script run for ``block`` here, and the commands it leaves out."""
    kept, skipped = [], []
    for command in commands(block):
        if any(command.startswith(start) for start in SKIPPED):
            skipped.append(command)
            continue
        command = REWRITES.get(command.partition("  #")[0].strip(), command)
        for placeholder, value in placeholders.items():
            command = command.replace(placeholder, value)
        kept.append(command)
    return "\n".join(kept), skipped


def placeholders(registry: str, local_port: int, example: Path) -> dict[str, str]:
    """What stands here for what the guide's reader has of their own, in the order they
    are replaced."""
    return {
        # A registry without TLS, as step 2 says to copy to one.
        "docker://registry.example": f"--dest-tls-verify=false docker://{registry}",
        "registry.example": registry,
        # The port-forward's local port: one that is free here.
        "127.0.0.1:8080": f"127.0.0.1:{local_port}",
        " 8080:80 ": f" {local_port}:80 ",
        EXAMPLE: str(example),  # edited as step 6 asks
    }


def test_what_the_walk_leaves_out_or_replaces_is_in_the_guide() -> None:
    """A skip, a rewrite or a placeholder that matches nothing would let the guide drift
    from its walk unseen."""
    everything = [command.partition("  #")[0].strip() for step in guide_steps()
                  for block in step.blocks for command in commands(block)]
    assert [s for s in SKIPPED if not any(c.startswith(s) for c in everything)] == []
    assert [c for c in REWRITES if c not in everything] == []
    stand_ins = placeholders("198.18.0.1:5000", 1, Path("pool.yaml"))
    assert [p for p in stand_ins if not any(p in c for c in everything)] == []
    assert len(everything) > 20


@dataclasses.dataclass
class Walk:
    """Runs the guide's blocks in bash from the repository's root, with the reader's
    tools on PATH, as a reader pastes them."""

    folder: Path
    placeholders: dict[str, str]
    env: dict[str, str]
    times: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def run(self, step: Step) -> str:
        started = time.monotonic()
        output, skipped = [], []
        for index, block in enumerate(step.blocks):
            script, left_out = runnable(block, self.placeholders)
            skipped += left_out
            output.append(self.bash(script, f"step-{step.number}-{index}"))
        self.times.append({"step": step.number, "title": step.title,
                           "seconds": round(time.monotonic() - started, 1),
                           "skipped": skipped})
        return "\n".join(output)

    def bash(self, script: str, name: str) -> str:
        log = self.folder / f"{name}.log"
        child = processes.spawn(name, ["bash", "-euo", "pipefail", "-c", script], log,
                                env=self.env, cwd=ROOT)
        try:
            code = child.process.wait(timeout=BLOCK_TIMEOUT)
        finally:
            child.stop(5)  # and what it left in the background
        output = log.read_text(errors="replace")
        assert code == 0, f"{name} exited {code}:\n{script}\n---\n{output[-4000:]}"
        return output


def edited_example(hub_url: str, folder: Path) -> Path:
    """The example pool with the edits step 6 asks for, made for this machine."""
    pool = yaml.safe_load((ROOT / EXAMPLE).read_text())
    spec = pool["spec"]
    spec["model"]["name"] = MIRRORED_REPO
    spec["image"] = SERVER_IMAGE
    spec["env"] = [{"name": "HF_ENDPOINT", "value": hub_url}]
    # No GPU here: none asked, no NVIDIA runtime, CPU's dtype, and two slots of the
    # two cores (not 256 streams' worth of pods).
    spec["resources"].update(gpus=0, cpu="1", memory="2Gi")
    del spec["runtimeClassName"]
    spec["dtype"] = "auto"
    spec["slots"] = 2
    path = folder / "production.yaml"
    path.write_text(yaml.safe_dump(pool))
    return path


@pytest.fixture
def gpu_node(cluster: NodeCluster) -> Iterator[str]:
    """One node labelled and tainted as a GPU node pool's are, as it was afterwards."""
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    name = str(sorted(node["metadata"]["name"] for node in nodes)[-1])
    cluster.kubectl("label", "node", name, "=".join(GPU_LABEL))
    cluster.kubectl("taint", "node", name, GPU_TAINT)
    try:
        yield name
    finally:
        cluster.kubectl("taint", "node", name, f"{GPU_TAINT}-", check=False)
        cluster.kubectl("label", "node", name, f"{GPU_LABEL[0]}-", check=False)


@pytest.fixture
def monitoring_crds(cluster: NodeCluster) -> Iterator[None]:
    """The Prometheus Operator's CRDs, as a cluster with that operator has them."""
    folder = _user_tools() / "crds"
    cluster.kubectl("apply", "--server-side", "-f", str(folder))
    try:
        yield
    finally:
        cluster.kubectl("delete", "-f", str(folder), "--wait=false", check=False)


def _user_tools() -> Path:
    """tools/cluster/user-tools' folder (built by ``make test`` before the suite)."""
    result = subprocess.run([str(USER_TOOLS)], capture_output=True, text=True, check=False,
                            timeout=1800)
    assert result.returncode == 0, result.stderr[-2000:]
    return Path(result.stdout.strip().splitlines()[-1])


def test_the_production_guide_runs_as_written(
        cluster: NodeCluster, chart_images: list[str], gpu_node: str,
        monitoring_crds: None, tmp_path: Path) -> None:
    from asrpool.server import models

    steps = guide_steps()
    assert [step.number for step in steps] == list(range(1, len(steps) + 1))
    preset = models.PRESETS["tiny"]
    models.save_checkpoint_dir(models.build_random("tiny"), tmp_path / "repo",
                               preset.mimi_config, preset.lm_kwargs)
    hub = hubs.Hub({MIRRORED_REPO: tmp_path / "repo"}, host=netns.HOST_ADDRESS)
    local_port = processes.free_port()
    with registries.running(netns.REGISTRY, tmp_path / "registry") as registry, \
            hub.running():
        example = edited_example(hub.url, tmp_path)
        walk = Walk(tmp_path / "walk", placeholders(registry, local_port, example),
                    _environment(cluster))
        checks = _checks(cluster, registry, gpu_node, hub)
        try:
            for step in steps:
                output = walk.run(step)
                if step.number in checks:
                    checks[step.number](output)
        finally:
            _report(walk.times)
            _uninstall(cluster, walk)
    assert all(step.blocks for step in steps if step.number in checks)


def _environment(cluster: NodeCluster) -> dict[str, str]:
    """The reader's shell: helm and kubectl on PATH, the cluster's kubeconfig and the
    secrets step 6 names. Images build on the cached base, as every test's do
    (imagebuilds.build_environment)."""
    path = [str(_user_tools() / "bin"), str(cluster.kubectl_path.parent), os.environ["PATH"]]
    return {**imagebuilds.build_environment(), "PATH": os.pathsep.join(path),
            "KUBECONFIG": str(cluster.kubeconfig),
            "HF_TOKEN": "hf_stand-in", "REGISTRY_USER": "reader",
            "REGISTRY_PASSWORD": "stand-in"}


def _checks(cluster: NodeCluster, registry: str, gpu_node: str,
            hub: hubs.Hub) -> dict[int, Callable[[str], None]]:
    """What each step must have done, beyond its commands' exiting 0."""

    def pushed(_: str) -> None:
        assert {"asrpool-control", "redis"} <= set(registries.catalog(registry))

    def installed(_: str) -> None:
        for name in ("operator", "router", "redis"):
            pods = test_chart.pods(cluster, "asrpool-system",
                                   f"app.kubernetes.io/component={name}")
            assert pods and all(test_chart.ready(pod) for pod in pods), name
            for pod in pods:  # pulled from the reader's registry by the nodes
                image = pod["status"]["containerStatuses"][0]["imageID"]
                assert image.startswith(f"{registry}/"), (name, image)
        for kind, name in (("servicemonitor", "asrpool-router"),  # the metrics values took
                           ("prometheusrule", "asrpool")):
            assert cluster.get("asrpool-system", kind, name), kind

    def pool_ready(_: str) -> None:
        pods = test_chart.pool_pods(cluster, "speech", "stt-en")
        assert pods and {pod["spec"]["nodeName"] for pod in pods} == {gpu_node}
        assert f"{MIRRORED_REPO}/config.json" in hub.downloads

    def transcribed(output: str) -> None:
        assert output.strip(), "no words"

    def exposed(_: str) -> None:
        def url() -> None:  # once the operator rolled with the new address
            found = cluster.get("speech", "asrpool", "stt-en")["status"]["url"]
            assert found == "wss://asr.example.com/pools/speech/stt-en/api/asr-streaming"

        asyncio.run(eventually(url, 120, period=1.0))
        ingress = cluster.get("asrpool-system", "ingress", "asrpool-router")
        (rule,) = ingress["spec"]["rules"]
        assert rule["host"] == "asr.example.com"
        assert ingress["spec"]["tls"][0]["secretName"] == "asr-example-tls"
        (path,) = rule["http"]["paths"]  # the client port alone, not the admin port
        assert path["backend"]["service"]["port"] == {"name": "http"}, path

    def upgraded(_: str) -> None:
        asyncio.run(eventually(lambda: pool_ready(""), 300, period=2.0))

    return {2: pushed, 3: installed, 6: pool_ready, 7: transcribed, 8: exposed, 10: upgraded}


def _report(times: list[dict[str, Any]]) -> None:
    path = os.environ.get("ASRPOOL_GUIDE_TIMES")
    if path:
        Path(path).write_text(json.dumps({"steps": times}, indent=2) + "\n")


def _uninstall(cluster: NodeCluster, walk: Walk) -> None:
    """What the walk made goes, as the next tests expect the cluster."""
    cluster.kubectl("delete", "asrpool", "--all", "-n", "speech", "--wait=true",
                    "--timeout=300s", check=False, timeout=330)
    walk.bash("helm uninstall asrpool -n asrpool-system --wait --timeout 5m || true",
               "uninstall")
    for namespace in NAMESPACES:
        cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=300s",
                        check=False, timeout=330)
    cluster.kubectl("delete", "priorityclass", "asr-serving", check=False)
    # The nodes' model cache (hostPath) is the host's own folder here.
    shutil.rmtree(NODE_CACHE / "speech", ignore_errors=True)
    with contextlib.suppress(OSError):
        NODE_CACHE.rmdir()  # if the walk made it
