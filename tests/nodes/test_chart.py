"""The chart on real nodes, from the project's own images, as a user installs it.

helm-python-sdk installs the chart with its own Redis (the redis image, password from
its Secret); the operator and the router (two workers) run from the control image, the
pools' server pods from the server image, every one in a container on a real kubelet,
locked down as the chart and the operator set them (uid 10001, read-only root). Clients
reach the router by its Service's DNS name from a pod, or by its pod address from here
(the host routes to the nodes' pod ranges over the cluster's bridge).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import redis

from asrpool.common import protocol, redis_acl, redis_clients, registry
from asrpool.operator import naming, sources
from asrpool_harness.localcluster import netns
from tests.nodes.clusters import NodeCluster
from tests.support import hubs, kyutai_client, redis_servers, streams
from tests.support.polling import eventually

pytestmark = pytest.mark.timeout(900)
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "asrpool"
CRD = ROOT / "crds" / "streamingasrpools.asrpool.io.yaml"
SAMPLE = ROOT / "samples" / "hello.wav"
RELEASE = "asrpool"  # objects are named asrpool-router, asrpool-redis, ...
REDIS_IMAGE = {"repository": "localhost/asrpool/redis", "tag": "7.0", "pullPolicy": "Never"}
STARTUP = 300.0  # images start on a shared 2-core machine
WAIT = 120.0


@dataclasses.dataclass(frozen=True)
class Release:
    namespace: str
    router: str  # the router pod's address:port
    api_key: str  # the key the chart generated (keys are on by default)

    @property
    def router_service(self) -> str:
        return f"{RELEASE}-router.{self.namespace}.svc.cluster.local"


def chart_values() -> dict[str, Any]:
    return {
        "images": {"control": {"pullPolicy": "Never"}},
        "operator": {"allNamespaces": False, "resyncSeconds": 2},
        "router": {"replicas": 1, "workers": 2, "autoscaling": {"enabled": False},
                   "preStopSleepSeconds": 0, "drainGraceSeconds": 5,
                   "terminationGracePeriodSeconds": 10},
        "redis": {"image": REDIS_IMAGE},
        "metrics": {"dashboard": {"enabled": False}},
    }


def pool(name: str, slots: int, revision: str | None = None, opus_workers: int = 0,
         engine_process: bool = False, intake_workers: int = 0) -> dict[str, Any]:
    model: dict[str, Any] = {"name": "tiny", **({"revision": revision} if revision else {})}
    return {"apiVersion": f"{naming.GROUP}/{naming.VERSION}", "kind": naming.KIND,
            "metadata": {"name": name},
            "spec": {"model": model, "slots": slots, "slotsPerPod": 1,
                     "imagePullPolicy": "Never", "drainGracePeriodSeconds": 60,
                     "opusWorkers": opus_workers, "engineProcess": engine_process,
                     "intakeWorkers": intake_workers,
                     "resources": {"gpus": 0, "cpu": "100m", "memory": "1Gi"}}}


def pods(cluster: NodeCluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    found = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    return [pod for pod in json.loads(found.stdout)["items"]
            if not pod["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod["status"].get("conditions", []))


def component(cluster: NodeCluster, namespace: str, name: str) -> dict[str, Any]:
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={name}"
    found = [pod for pod in pods(cluster, namespace, selector) if ready(pod)]
    assert len(found) == 1, f"{len(found)} ready {name} pods"
    return found[0]


def pool_pods(cluster: NodeCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return pods(cluster, namespace, f"{naming.POOL_LABEL}={name}")


@pytest.fixture(scope="module")
def release(cluster: NodeCluster, chart_images: list[str]) -> Iterator[Release]:
    namespace = f"chart-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("apply", "--server-side", "-f", str(CRD))
    cluster.wait_established("streamingasrpools.asrpool.io")
    cluster.kubectl("create", "namespace", namespace)
    cluster.wait_for_service_account(namespace)
    config = helm_python.Config(kubeconfig_path=str(cluster.kubeconfig), namespace=namespace)
    try:
        config.install(str(CHART), RELEASE, chart_values(), namespace=namespace, timeout=120)
        for name in ("redis", "operator"):
            asyncio.run(eventually(lambda name=name: component(cluster, namespace, name),
                                   STARTUP, period=2.0))
        router = asyncio.run(eventually(lambda: component(cluster, namespace, "router"),
                                        STARTUP, period=2.0))
        secret = cluster.get(namespace, "secret", f"{RELEASE}-api-keys")
        key = base64.b64decode(secret["data"]["generated-key"]).decode()
        yield Release(namespace, f"{router['status']['podIP']}:8080", key)
    finally:
        try:
            config.uninstall(RELEASE, timeout=60)
        finally:
            config.close()
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def serving(cluster: NodeCluster, namespace: str, name: str, count: int) -> list[str]:
    """The pool's pods once ``count`` are ready and the pool reports their slots free."""
    found = pool_pods(cluster, namespace, name)
    assert len(found) == count and all(ready(pod) for pod in found), [
        (pod["metadata"]["name"], pod["status"].get("containerStatuses")) for pod in found]
    status = cluster.get(namespace, "asrpool", name).get("status") or {}
    assert (status.get("slots"), status.get("freeSlots")) == (count, count), status
    return [pod["metadata"]["name"] for pod in found]


def test_every_container_runs_as_its_user_with_a_read_only_root(
        cluster: NodeCluster, release: Release) -> None:
    namespace = release.namespace
    cluster.apply(namespace, pool("locked", slots=1))
    (server,) = asyncio.run(eventually(lambda: serving(cluster, namespace, "locked", 1),
                                       STARTUP, period=2.0))
    expected = {server: "10001", component(cluster, namespace, "redis")["metadata"]["name"]:
                "999"}
    for name in ("operator", "router"):
        expected[component(cluster, namespace, name)["metadata"]["name"]] = "10001"
    for pod, user in expected.items():
        assert cluster.exec(namespace, pod, "id", "-u").strip() == user, pod
        write = cluster.kubectl("exec", "-n", namespace, pod, "--", "touch", "/written",
                                check=False)
        assert write.returncode != 0 and "Read-only file system" in write.stderr, pod
    # PID 1 is the product itself (no shell in between), so SIGTERM reaches it.
    assert "asrpool" in cluster.exec(namespace, server, "cat", "/proc/1/cmdline")
    cluster.kubectl("delete", "-n", namespace, "asrpool/locked", "--wait=true")


def test_streams_through_the_routers_service_get_words_pcm_and_opus_through_lanes(
        cluster: NodeCluster, release: Release) -> None:
    """Client pods (the server image has the file reader) stream samples/hello.wav to
    the router's Service by its DNS name, through kube-proxy and CoreDNS: once as PCM,
    once as Ogg Opus, which the pool's pod decodes in its Opus lanes (``opusWorkers``),
    child processes of the locked-down server container; its model runs in an engine
    process too (``engineProcess``), and its streams' messages are read in intake
    processes (``intakeWorkers``)."""
    namespace = release.namespace
    cluster.apply(namespace, pool("stt", slots=1, opus_workers=2, engine_process=True,
                                  intake_workers=2))
    (server,) = asyncio.run(eventually(lambda: serving(cluster, namespace, "stt", 1),
                                       STARTUP, period=2.0))
    cluster.kubectl("create", "configmap", "sample", "-n", namespace,
                    f"--from-file=hello.wav={SAMPLE}")  # binaryData, too large to apply
    for name, flags in (("pcm", []), ("opus", ["--opus"])):
        messages = _streamed_from_a_pod(cluster, release, f"client-{name}", flags)
        assert [m for m in messages if m.get("type") == "Word"], (name, messages)
        assert not [m for m in messages if m.get("type") == "Error"], (name, messages)
    assert _children_running(cluster, namespace, server, "asrpool.server.opusworker") == 2
    assert _children_running(cluster, namespace, server, "spawn_main") == 1  # the engine
    asyncio.run(eventually(lambda: serving(cluster, namespace, "stt", 1), WAIT))  # slot free
    cluster.kubectl("delete", "-n", namespace, "asrpool/stt", "--wait=true")


def _streamed_from_a_pod(cluster: NodeCluster, release: Release, name: str,
                         flags: list[str]) -> list[dict[str, Any]]:
    """What ``asrpool stream --json`` printed in a client pod, which must exit 0."""
    namespace = release.namespace
    url = f"ws://{release.router_service}/api/asr-streaming?pool=stt"
    command = ["asrpool", "stream", "--json", "--rtf", "4", "--api-key", release.api_key,
               *flags, url, "/sample/hello.wav"]
    client = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "enableServiceLinks": False,
        "securityContext": {"runAsUser": 10001, "runAsNonRoot": True},
        "containers": [{"name": "client", "image": "ghcr.io/asrpool/asrpool:0.1.0",
                        "imagePullPolicy": "Never", "command": command,
                        "securityContext": {"readOnlyRootFilesystem": True},
                        "volumeMounts": [{"name": "sample", "mountPath": "/sample"}]}],
        "volumes": [{"name": "sample", "configMap": {"name": "sample"}}]}}
    cluster.apply(namespace, client)

    def finished() -> dict[str, Any]:
        state = cluster.get(namespace, "pod", name)["status"].get("containerStatuses")
        terminated = ((state or [{}])[0].get("state") or {}).get("terminated")
        assert terminated, state
        return dict(terminated)

    terminated = asyncio.run(eventually(finished, STARTUP, period=2.0))
    output = cluster.kubectl("logs", "-n", namespace, name).stdout
    assert terminated["exitCode"] == 0, output[-2000:]
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def _children_running(cluster: NodeCluster, namespace: str, pod: str, marker: str) -> int:
    """Processes in the server container whose command line holds ``marker``: the Opus
    lanes run their module, a multiprocessing child ``spawn_main``."""
    # The marker's bytes are written out as numbers, so this command's own cmdline
    # does not count.
    count = (f"import pathlib; marker = bytes({list(marker.encode())}); print(sum("
             "marker in p.read_bytes() for p in pathlib.Path('/proc').glob('[0-9]*/cmdline')))")
    return int(cluster.exec(namespace, pod, "python3", "-c", count))


@pytest.fixture(scope="module")
def chart_redis(cluster: NodeCluster, release: Release) -> Iterator[tuple[str, str]]:
    """The chart's Redis through a port-forward (its NetworkPolicy admits no one else
    from here), as the operator's user, its password from the chart's Secret."""
    pod = component(cluster, release.namespace, "redis")
    secret = cluster.get(release.namespace, "secret", f"{RELEASE}-redis")
    password = base64.b64decode(secret["data"]["operator-password"]).decode()
    with cluster.port_forward(release.namespace, pod["metadata"]["name"], 6379) as port:
        yield f"redis://asrpool-operator@127.0.0.1:{port}/0", password


async def assert_pods_are_confined_to_their_namespace(
        cluster: NodeCluster, namespace: str, name: str, operator_url: str) -> None:
    """The pool's pods heartbeat as their namespace's own Redis user (the pool serves),
    whose password the operator wrote into the pool's namespace; with it, no member list
    and no other namespace's pool can be written."""
    config_map = cluster.get(namespace, "configmap", f"{name}-config")
    user = redis_acl.pod_user(namespace)
    assert config_map["data"]["ASRPOOL_REDIS_URL"].startswith(f"redis://{user}@")
    secret = cluster.get(namespace, "secret", f"{name}-redis")
    password = base64.b64decode(secret["data"]["password"]).decode()
    url = redis_clients.with_username(operator_url, user)
    client = redis_clients.connect(url, 5.0, password=password)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            await registry.publish_members(client, naming.registry_name(namespace, name),
                                           {f"{namespace}/rogue": "198.18.0.9"})
        beat = registry.PodHeartbeat("other/rogue", "other/stt", "198.18.0.9:8080", 8, 8,
                                     False, "m")
        with pytest.raises(redis.exceptions.ResponseError, match="one of the keys"):
            await registry.write_heartbeat(client, beat, announce=False)
    finally:
        await client.aclose()


async def busy_pod(url: str, registry_name: str, password: str) -> str:
    """The name of the one pod whose heartbeat reports a used slot (its id is
    NAMESPACE/NAME)."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while True:
        use = await redis_servers.used_slots(url, registry_name, password)
        busy = [pod_id.partition("/")[2] for pod_id, used in use.items() if used]
        if len(busy) == 1:
            return busy[0]
        assert asyncio.get_running_loop().time() < deadline, use
        await asyncio.sleep(1.0)


async def test_scale_down_removes_the_idle_pod_and_a_model_roll_drains_the_busy_one(
        cluster: NodeCluster, release: Release, chart_redis: tuple[str, str]) -> None:
    """SIGTERM reaches the server (PID 1) in its container; it drains its stream to
    the end while the Deployment controller rolls the pool."""
    namespace = release.namespace
    roll = pool("roll", slots=2)
    # The drained stream's audio is all transcribed first: time for a pod of 100m CPU on a
    # loaded machine (the engine fell 11 s behind real time once, and 60 s ran out).
    roll["spec"]["drainGracePeriodSeconds"] = 240
    cluster.apply(namespace, roll)
    await eventually(lambda: serving(cluster, namespace, "roll", 2), STARTUP, period=2.0)

    url, password = chart_redis
    await assert_pods_are_confined_to_their_namespace(cluster, namespace, "roll", url)
    stream_url = f"ws://{release.router}/api/asr-streaming?pool=roll"
    key = {protocol.API_KEY_HEADER: release.api_key}
    async with kyutai_client.paced_stream(stream_url, WAIT, timeout=600, headers=key) as stream:
        busy = await busy_pod(url, naming.registry_name(namespace, "roll"), password)
        names = {pod["metadata"]["name"] for pod in pool_pods(cluster, namespace, "roll")}
        (idle,) = names - {busy}
        cluster.kubectl("scale", "-n", namespace, "asrpool/roll", "--replicas=1")

        def scaled_down() -> None:
            remaining = {pod["metadata"]["name"] for pod in pool_pods(cluster, namespace, "roll")}
            assert remaining == {busy}, remaining

        await eventually(scaled_down, WAIT, period=1.0)
        assert idle not in {p["metadata"]["name"] for p in pool_pods(cluster, namespace, "roll")}
        assert stream.is_open()

        cluster.kubectl("patch", "-n", namespace, "asrpool/roll", "--type=merge", "-p",
                        json.dumps({"spec": {"model": {"name": "tiny", "revision": "b"}}}))

        def draining() -> None:
            found = cluster.kubectl("get", "pod", "-n", namespace, busy, "-o", "json",
                                    check=False)
            assert found.returncode == 0, "the busy pod left before its stream ended"
            assert json.loads(found.stdout)["metadata"].get("deletionTimestamp")

        await eventually(draining, STARTUP, period=1.0)
        assert stream.is_open()
        transcript = await stream.finish()

    def rolled() -> None:
        names = {pod["metadata"]["name"] for pod in pool_pods(cluster, namespace, "roll")}
        assert busy not in names and len(names) == 1, names
        gone = cluster.kubectl("get", "pod", "-n", namespace, busy, check=False)
        assert gone.returncode != 0  # it left once its stream ended

    await eventually(rolled, STARTUP, period=1.0)
    assert [m for m in transcript if m["type"] == "Error"] == []
    assert (transcript[-1]["type"], transcript[-1]["id"]) == ("Marker", 0)
    cluster.kubectl("delete", "-n", namespace, "asrpool/roll", "--wait=true")


def test_the_model_cache_is_written_by_the_init_container_and_read_by_the_server(
        cluster: NodeCluster, release: Release, tmp_path: Path) -> None:
    """A pool whose model is a repo: the fetch-model init container downloads it (from a
    stand-in Hub on the cluster's bridge, the real Hub being out of reach) into the
    cache volume as uid 10001, and the server loads it from there, read-only root and
    all, and serves a stream."""
    from asrpool.server import models

    preset = models.PRESETS["tiny"]
    models.save_checkpoint_dir(models.build_random("tiny"), tmp_path / "repo",
                               preset.mimi_config, preset.lm_kwargs)
    namespace = release.namespace
    with hubs.Hub({"acme/stt-tiny": tmp_path / "repo"}, host=netns.HOST_ADDRESS).running() \
            as hub:
        body = pool("cached", slots=1)
        body["spec"]["model"] = {"name": "acme/stt-tiny"}
        body["spec"]["env"] = [{"name": "HF_ENDPOINT", "value": hub.url}]
        cluster.apply(namespace, body)
        (server,) = asyncio.run(eventually(lambda: serving(cluster, namespace, "cached", 1),
                                           STARTUP, period=2.0))
        assert "acme/stt-tiny/config.json" in hub.downloads
    # Every file the init container wrote into the cache volume is uid 10001's.
    owners = cluster.exec(namespace, server, "find", sources.HUB_CACHE, "-type", "f",
                          "-exec", "stat", "-c", "%u %n", "{}", "+")
    files = [line.split(" ", 1) for line in owners.splitlines() if line.strip()]
    assert len(files) >= 5 and {owner for owner, _ in files} == {"10001"}, owners
    pcm = streams.random_speechlike(2.0, seed=5)
    url = f"ws://{release.router}/api/asr-streaming?pool=cached"
    key = {protocol.API_KEY_HEADER: release.api_key}
    transcript = asyncio.run(kyutai_client.transcribe(url, pcm, short=True, timeout=WAIT,
                                                      headers=key))
    assert (transcript[-1]["type"], transcript[-1]["id"]) == ("Marker", 0)
    cluster.kubectl("delete", "-n", namespace, "asrpool/cached", "--wait=true")
