"""The Helm chart installed by helm-python-sdk on the real control plane, used for real.

The operator and the router run as pods under the chart's service accounts, so every
request they make meets RBAC; the pools' server pods are real ``asrpool serve --model
tiny`` processes started by the node agent; the real ReplicaSet controller chooses
which pod a scale-down removes (by the operator's ``pod-deletion-cost``) and the real
Deployment controller rolls a model change. Redis is a local server (the chart's
"external Redis"): no image can run here. It requires a password, which the router,
the operator and the server pods read from a Secret in the release namespace.
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
import kubernetes
import pytest

from asrpool.common import protocol
from asrpool.operator import naming
from tests.cluster.clusters import Cluster
from tests.support import kyutai_client, redis_servers
from tests.support.polling import eventually

pytestmark = pytest.mark.timeout(600)
CHART = Path(__file__).resolve().parents[2] / "charts" / "asrpool"
RELEASE = "asrpool"
REDIS_PASSWORD = "chart-test-redis-password"
STARTUP = 180.0  # tiny-model pods, the operator and a router on a shared 2-core machine
WAIT = 90.0


@dataclasses.dataclass(frozen=True)
class Release:
    namespace: str
    redis: redis_servers.RedisServer
    router: str  # the router pod's address:port
    api_key: str  # the key the chart generated (keys are on by default)

    @property
    def key_header(self) -> dict[str, str]:
        return {protocol.API_KEY_HEADER: self.api_key}

    @property
    def operator_account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{RELEASE}-operator"


def chart_values(redis_url: str) -> dict[str, Any]:
    return {
        "operator": {"allNamespaces": False, "resyncSeconds": 2},
        "router": {"replicas": 1, "autoscaling": {"enabled": False},
                   "preStopSleepSeconds": 0, "drainGraceSeconds": 5,
                   "terminationGracePeriodSeconds": 10},
        "redis": {"enabled": False, "external": {
            "url": redis_url, "passwordSecret": {"name": "redis-credentials", "key": "pw"}}},
        "metrics": {"dashboard": {"enabled": False}},
    }


def pods_of(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    found = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    return list(json.loads(found.stdout)["items"])


def ready_pod(cluster: Cluster, namespace: str, selector: str) -> dict[str, Any]:
    pods = [pod for pod in pods_of(cluster, namespace, selector)
            if not pod["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True"
                    for c in pod["status"].get("conditions", []))]
    assert len(pods) == 1, f"{len(pods)} ready pods for {selector}"
    return pods[0]


@pytest.fixture(scope="module")
def release(cluster: Cluster, crd: None, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Release]:
    namespace = f"asr-{uuid.uuid4().hex[:6]}"
    core = kubernetes.client.CoreV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": namespace}})
    cluster.wait_for_service_account(namespace)
    core.create_namespaced_secret(namespace, {"metadata": {"name": "redis-credentials"},
                                              "stringData": {"pw": REDIS_PASSWORD}})
    redis = redis_servers.RedisServer(tmp_path_factory.mktemp("redis"), password=REDIS_PASSWORD)
    redis.start()
    config = helm_python.Config(kubeconfig_path=str(cluster.kubeconfig), namespace=namespace)
    try:
        config.install(str(CHART), RELEASE, chart_values(redis.url), namespace=namespace,
                       timeout=120)
        selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component="
        router = asyncio.run(eventually(lambda: ready_pod(cluster, namespace, selector + "router"),
                                        STARTUP, period=1.0))
        asyncio.run(eventually(lambda: ready_pod(cluster, namespace, selector + "operator"),
                               STARTUP, period=1.0))
        yield Release(namespace, redis, f"{router['status']['podIP']}:8080",
                      generated_key(core, namespace))
    finally:
        try:
            config.uninstall(RELEASE, timeout=60)
        finally:
            config.close()
            core.delete_namespace(namespace)
            redis.stop()


def generated_key(core: kubernetes.client.CoreV1Api, namespace: str) -> str:
    secret = core.read_namespaced_secret(f"{RELEASE}-api-keys", namespace)
    return base64.b64decode(secret.data["generated-key"]).decode()


def test_the_operator_meets_rbac_as_its_own_service_account(
    cluster: Cluster, release: Release
) -> None:
    def can(verb: str, resource: str, namespace: str) -> str:
        answer = cluster.kubectl("auth", "can-i", verb, resource, "-n", namespace,
                                 f"--as={release.operator_account}", check=False)
        return answer.stdout.strip()

    assert can("patch", "streamingasrpools.asrpool.io/status", release.namespace) == "yes"
    assert can("create", "deployments.apps", release.namespace) == "yes"
    # Namespace-scoped by the chart's values: nothing in any other namespace.
    assert can("create", "deployments.apps", "default") == "no"
    assert can("list", "secrets", release.namespace) == "no"


def pool(name: str, model: str, slots: int) -> dict[str, Any]:
    return {"apiVersion": f"{naming.GROUP}/{naming.VERSION}", "kind": naming.KIND,
            "metadata": {"name": name},
            "spec": {"model": {"name": model}, "slots": slots, "slotsPerPod": 1,
                     "resources": {"gpus": 0, "cpu": "1"}, "drainGracePeriodSeconds": 30}}


def deployment_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(cluster.get(namespace, "deployment", name).get("status") or {})


def pod_names(cluster: Cluster, namespace: str, pool_name: str) -> set[str]:
    return {pod["metadata"]["name"]
            for pod in pods_of(cluster, namespace, f"{naming.POOL_LABEL}={pool_name}")
            if not pod["metadata"].get("deletionTimestamp")}


async def test_scale_down_removes_the_idle_pod_and_a_model_roll_drains_the_busy_one(
    cluster: Cluster, release: Release
) -> None:
    namespace = release.namespace
    cluster.apply(namespace, pool("stt", "tiny", slots=2))

    def available(count: int) -> None:
        status = deployment_status(cluster, namespace, "stt")
        assert status.get("availableReplicas") == count == status.get("replicas"), status

    await eventually(lambda: available(2), STARTUP, period=1.0)

    def slots_reported(slots: int, free: int) -> None:
        status = cluster.get(namespace, "asrpool", "stt").get("status") or {}
        assert (status.get("slots"), status.get("freeSlots")) == (slots, free), status

    await eventually(lambda: slots_reported(2, 2), WAIT, period=1.0)  # pods beat, with the password
    for kind in ("deployment", "configmap"):
        objects = cluster.kubectl("get", kind, "-n", namespace, "-o", "json").stdout
        assert REDIS_PASSWORD not in objects  # by reference to the Secret only

    url = f"ws://{release.router}/api/asr-streaming?pool=stt"
    async with kyutai_client.paced_stream(url, WAIT, timeout=400,
                                          headers=release.key_header) as stream:
        await eventually(lambda: slots_reported(2, 1), WAIT, period=1.0)
        use = await redis_servers.used_slots(release.redis.url, f"{namespace}/stt", REDIS_PASSWORD)
        (busy,) = [pod_id.partition("/")[2] for pod_id, used in use.items() if used]
        (idle,) = pod_names(cluster, namespace, "stt") - {busy}

        # The real ReplicaSet controller picks the pod to delete: the idle one.
        cluster.kubectl("scale", "-n", namespace, "asrpool/stt", "--replicas=1")
        await eventually(lambda: available(1), WAIT, period=1.0)
        remaining = pod_names(cluster, namespace, "stt")
        assert idle not in remaining and remaining == {busy}
        assert stream.is_open()  # audio still flowing

        # A model change rolls the pool: a new pod first (maxSurge 1, maxUnavailable 0),
        # then the old one is deleted and drains: it stays while its stream runs.
        cluster.kubectl("patch", "-n", namespace, "asrpool/stt", "--type=merge",
                        "-p", json.dumps({"spec": {"model": {"name": "tiny", "revision": "b"}}}))

        def draining() -> None:
            (old,) = [pod for pod in pods_of(cluster, namespace, f"{naming.POOL_LABEL}=stt")
                      if pod["metadata"]["name"] == busy]
            assert old["metadata"].get("deletionTimestamp"), "the old pod is not stopping yet"

        await eventually(draining, STARTUP, period=1.0)
        assert stream.is_open()
        transcript = await stream.finish()

        def rolled() -> None:
            names = pod_names(cluster, namespace, "stt")
            assert busy not in names and len(names) == 1, names
            assert not [pod for pod in pods_of(cluster, namespace, f"{naming.POOL_LABEL}=stt")
                        if pod["metadata"]["name"] == busy]  # it left once its stream ended
            status = deployment_status(cluster, namespace, "stt")
            assert status.get("updatedReplicas") == status.get("availableReplicas") == 1

        await eventually(rolled, STARTUP, period=1.0)
    assert [m for m in transcript if m["type"] == "Error"] == []
    assert (transcript[-1]["type"], transcript[-1]["id"]) == ("Marker", 0)


def test_a_pool_serves_a_saved_checkpoint_from_a_host_path_through_the_router(
    cluster: Cluster, release: Release, tmp_path: Path
) -> None:
    """A random ``tiny`` model saved in Kyutai's repo layout, on a node folder
    (``spec.model.volume.hostPath``): the pod loads it from the read-only mount and a
    stream through the router gets the words the same checkpoint gives in-process."""
    import torch

    from asrpool.server import engine, events, models, transcribing
    from tests.support import streams

    preset = models.PRESETS["tiny"]
    models.save_checkpoint_dir(models.build_random("tiny"), tmp_path / "stt-tiny",
                               preset.mimi_config, preset.lm_kwargs)
    namespace = release.namespace
    body = pool("saved", "tiny", slots=1)
    body["spec"]["model"] = {"volume": {"hostPath": str(tmp_path), "subPath": "stt-tiny"}}
    # One torch thread in the pod and here (the same float reductions), and the same
    # rolling context: the same words.
    body["spec"]["env"] = [{"name": "ASRPOOL_TORCH_THREADS", "value": "1"}]
    body["spec"]["context"] = 100
    cluster.apply(namespace, body)

    def serving() -> dict[str, Any]:
        found = pods_of(cluster, namespace, f"{naming.POOL_LABEL}=saved")
        assert len(found) == 1, found
        pod = found[0]
        assert any(c["type"] == "Ready" and c["status"] == "True"
                   for c in pod["status"].get("conditions", [])), pod["status"]
        status = cluster.get(namespace, "asrpool", "saved").get("status") or {}
        assert status.get("freeSlots") == 1, status
        return pod

    pod = asyncio.run(eventually(serving, STARTUP, period=1.0))
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert not [v for v in pod["spec"]["volumes"] if v.get("projected")]  # no API token
    pcm = streams.random_speechlike(3.0, seed=12)
    url = f"ws://{release.router}/api/asr-streaming?pool=saved"
    transcript = asyncio.run(kyutai_client.transcribe(url, pcm, short=True, timeout=WAIT,
                                                      headers=release.key_header))
    assert (transcript[-1]["type"], transcript[-1]["id"]) == ("Marker", 0)
    loaded = models.load_model(str(tmp_path / "stt-tiny"), context=100)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with engine.BatchedEngine(loaded, 1) as alone:
            expected = transcribing.words_of(transcribing.run_messages(
                alone, kyutai_client.short_messages(pcm)))
    finally:
        torch.set_num_threads(threads)
    assert kyutai_client.words(transcript) == kyutai_client.words(
        [events.to_message(word) for word in expected])
    assert kyutai_client.words(transcript), "the random model should emit some words"
    cluster.kubectl("delete", "-n", namespace, "asrpool/saved", "--wait=true")
