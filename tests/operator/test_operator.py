"""The real kopf operator against the kmock emulator (real HTTP) and a real Redis."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from kopf.testing import KopfRunner

from asrpool.common import seeds
from asrpool.operator import kube, naming
from tests.operator import checks, emulator
from tests.support import redis_servers
from tests.support.polling import eventually

NS = emulator.NAMESPACE
pytestmark = pytest.mark.timeout(90)


async def test_a_new_pool_gets_its_children_owned_by_it(
    cluster: emulator.Cluster, operator: KopfRunner
) -> None:
    found = await checks.created(cluster, slots=20)
    pool = cluster.get(emulator.POOLS, NS, "stt")
    assert pool is not None
    for child in found.values():
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner["uid"] == pool["metadata"]["uid"]
        assert owner["kind"] == "StreamingASRPool" and owner["controller"] is True
        assert child["metadata"]["labels"][naming.POOL_LABEL] == "stt"
    assert found["deployments"]["spec"]["replicas"] == 3
    assert found["configmaps"]["data"]["ASRPOOL_POOL"] == f"{NS}/stt"  # registry: ns/name
    await eventually(lambda: cluster.events(NS, "Created")[3])


async def test_status_and_conditions_follow_the_pods_and_redis(
    cluster: emulator.Cluster, operator: KopfRunner, redis_server: redis_servers.RedisServer
) -> None:
    await checks.created(cluster)
    not_ready = await eventually(lambda: checks.condition(cluster, "Ready"))
    assert not_ready["status"] == "False"
    assert checks.condition(cluster, "Degraded")["status"] == "False"
    pods = await cluster.run_deployment(NS, "stt")
    await checks.beat(redis_server.url, pods[0], 8, 3)
    await checks.beat(redis_server.url, pods[1], 8, 8)

    def ready() -> dict[str, Any]:
        assert checks.condition(cluster, "Ready")["status"] == "True"
        status = checks.pool_status(cluster)
        assert (status["slots"], status["freeSlots"], status["activeStreams"]) == (16, 11, 5)
        return status

    status = await eventually(ready)
    assert status["readyReplicas"] == status["replicas"] == 2
    assert status["selector"] == naming.selector_text("stt")
    assert status["observedGeneration"] == 1
    assert checks.condition(cluster, "Progressing")["status"] == "False"


async def test_a_second_pass_changes_nothing(
    cluster: emulator.Cluster, operator: KopfRunner
) -> None:
    await checks.created(cluster)
    await eventually(lambda: checks.condition(cluster, "Ready"))
    settled = cluster.mark()
    await eventually(lambda: checks.assert_at_least(checks.passes(cluster, settled), 4))
    assert cluster.writes_since(settled) == []


async def test_an_update_rolls_the_pods_through_the_config(
    cluster: emulator.Cluster, operator: KopfRunner
) -> None:
    before = await checks.created(cluster)
    old_hash = before["deployments"]["spec"]["template"]["metadata"]["annotations"]
    await cluster.patch(kube.POOLS, NS, "stt", {"spec": {"context": 750}})

    def rolled() -> None:
        found = checks.children_of(cluster)
        assert found["configmaps"]["data"]["ASRPOOL_CONTEXT"] == "750"
        assert found["deployments"]["spec"]["template"]["metadata"]["annotations"] != old_hash

    await eventually(rolled)
    assert checks.replicas(cluster) == 2


async def test_scaling_up(cluster: emulator.Cluster, operator: KopfRunner) -> None:
    await checks.created(cluster)
    await cluster.patch(kube.POOLS, NS, "stt", {"spec": {"slots": 40}})
    await eventually(lambda: checks.assert_at_least(checks.replicas(cluster), 5))
    assert checks.replicas(cluster) == 5
    template = checks.children_of(cluster)["deployments"]["spec"]["template"]
    assert template["metadata"]["annotations"][naming.CONFIG_HASH_ANNOTATION]
    await eventually(lambda: cluster.events(NS, "Scaled")[0])


async def test_scaling_down_marks_idle_pods_first_from_redis(
    cluster: emulator.Cluster, operator: KopfRunner, redis_server: redis_servers.RedisServer
) -> None:
    await checks.created(cluster, slots=24)
    pods = await cluster.run_deployment(NS, "stt")
    for pod, free in zip(pods, [3, 8, 6], strict=True):  # 5, 0 and 2 streams
        await checks.beat(redis_server.url, pod, 8, free)
    mark = cluster.mark()
    await cluster.patch(kube.POOLS, NS, "stt", {"spec": {"slots": 8}})
    await eventually(lambda: checks.assert_at_most(checks.replicas(cluster), 1))

    costs = {p["metadata"]["name"]: p["metadata"]["annotations"][naming.DELETION_COST_ANNOTATION]
             for p in cluster.pods_of(NS, "stt")}
    assert costs == dict(zip(pods, ["5", "0", "2"], strict=True))
    writes = cluster.writes_since(mark)
    cost_writes = [i for i, r in enumerate(writes) if r.resource == emulator.PODS]
    scale_write = next(i for i, r in enumerate(writes) if r.resource == emulator.DEPLOYMENTS)
    assert len(cost_writes) == 3 and max(cost_writes) < scale_write
    remaining = await cluster.run_deployment(NS, "stt")
    assert remaining == [pods[0]]  # the busiest pod stays
    message = (await eventually(lambda: cluster.events(NS, "Scaled")[-1]))["message"]
    assert "deletion cost set on 3 pods" in message


async def test_no_scale_down_without_redis(
    cluster: emulator.Cluster, operator: KopfRunner, redis_server: redis_servers.RedisServer
) -> None:
    await checks.created(cluster, slots=24)
    await cluster.run_deployment(NS, "stt")
    redis_server.kill()
    mark = cluster.mark()
    await cluster.patch(kube.POOLS, NS, "stt", {"spec": {"slots": 8}})
    await eventually(lambda: checks.assert_at_least(checks.passes(cluster, mark), 3))
    assert checks.replicas(cluster) == 3
    redis_server.start()
    await eventually(lambda: checks.assert_at_most(checks.replicas(cluster), 1))


async def test_a_child_deleted_or_edited_by_hand_is_put_back(
    cluster: emulator.Cluster, operator: KopfRunner
) -> None:
    await checks.created(cluster)
    await cluster.delete(kube.SERVICES, NS, "stt")
    await cluster.delete(kube.CONFIG_MAPS, NS, "stt-config")
    await cluster.patch(kube.DEPLOYMENTS, NS, "stt", {"spec": {"replicas": 7}})
    await eventually(lambda: checks.children_of(cluster))
    await eventually(lambda: checks.assert_equal(checks.replicas(cluster), 2))


async def test_an_invalid_pool_is_degraded_and_its_children_are_left_alone(
    cluster: emulator.Cluster, operator: KopfRunner, redis_server: redis_servers.RedisServer
) -> None:
    before = await checks.created(cluster, maxGPUs=4)
    await checks.beat(redis_server.url, "stt-0", 8, 3)  # its live pods still count
    await cluster.create(checks.manifest("other", slots=8))
    await eventually(lambda: checks.children_of(cluster, "other"))
    mark = cluster.mark()
    await cluster.patch(kube.POOLS, NS, "stt", {"spec": {"slots": 64}})

    degraded = await eventually(lambda: checks.assert_degraded(cluster))
    assert "spec.slots=64 needs 8 pods x 1 GPU = 8 GPUs" in degraded["message"]
    assert "spec.maxGPUs=4" in degraded["message"]
    await eventually(lambda: checks.assert_at_least(checks.passes(cluster, mark), 4))
    pool_writes = {r.resource for r in cluster.writes_since(mark)}
    assert pool_writes <= {emulator.POOLS}, pool_writes
    assert checks.children_of(cluster) == before
    assert checks.condition(cluster, "Degraded", "other")["status"] == "False"
    warning = await eventually(lambda: cluster.events(NS, "InvalidSpec")[0])
    assert warning["type"] == "Warning"
    status = checks.pool_status(cluster)
    assert (status["slots"], status["freeSlots"]) == (8, 3)  # read as NAMESPACE/NAME


async def test_a_pool_invalid_from_the_start_gets_no_children(
    cluster: emulator.Cluster, operator: KopfRunner
) -> None:
    bounds = {"enabled": True, "minSlots": 64, "maxSlots": 32}
    await cluster.create(checks.manifest(autoscaling=bounds))
    degraded = await eventually(lambda: checks.assert_degraded(cluster))
    assert "minSlots (64) is above maxSlots (32)" in degraded["message"]
    assert cluster.get(emulator.DEPLOYMENTS, NS, "stt") is None
    await cluster.patch(kube.POOLS, NS, "stt", {"spec": {"autoscaling": {"minSlots": 8}}})
    await eventually(lambda: checks.children_of(cluster))
    await eventually(lambda: checks.assert_equal(
        checks.condition(cluster, "Degraded")["status"], "False"))


async def test_deleting_a_pool_leaves_its_children_to_the_garbage_collector(
    cluster: emulator.Cluster, operator: KopfRunner
) -> None:
    await checks.created(cluster)
    await cluster.delete(kube.POOLS, NS, "stt")
    await eventually(lambda: checks.assert_gone(cluster))  # kopf stopped its timer, released it
    assert await cluster.collect_garbage(NS) == len(checks.KINDS)
    await cluster.create(checks.manifest("probe"))  # a pass over another pool proves the loop runs
    await eventually(lambda: checks.children_of(cluster, "probe"))
    for resource, name in checks.KINDS.items():
        assert cluster.get(resource, NS, name) is None


async def test_a_pool_deleted_during_a_pass_is_released_when_the_pass_ends(
    cluster: emulator.Cluster, operator: KopfRunner
) -> None:
    """kopf keeps the finalizer until the resync timer's pass returns, then looks again
    after ``background.cancellation_polling``: 60 s by default, so a pool deleted mid-pass
    stayed Terminating for a minute (a real control plane's kubectl delete timed out)."""
    await checks.created(cluster)
    await eventually(lambda: checks.condition(cluster, "Ready"))
    cluster.emulator.stall(emulator.DEPLOYMENTS, 2.0)
    await asyncio.wait_for(cluster.emulator.stalled.wait(), 10)  # a resync pass is running
    await cluster.delete(kube.POOLS, NS, "stt")
    await eventually(lambda: checks.assert_gone(cluster), timeout=20)  # well short of 60 s


async def test_autoscaling_follows_the_streams(
    cluster: emulator.Cluster, operator: KopfRunner, redis_server: redis_servers.RedisServer
) -> None:
    await checks.created(cluster, slots=8, autoscaling={
        "enabled": True, "minSlots": 8, "maxSlots": 64, "targetFreeFraction": 0.25,
        "scaleDownStabilizationSeconds": 0})
    await checks.beat(redis_server.url, "stt-0", 8, 0)
    await checks.beat(redis_server.url, "stt-x", 24, 4)  # 28 streams: 28 / 0.75 -> 38 -> 40 slots
    await eventually(lambda: checks.assert_at_least(checks.replicas(cluster), 5))
    pool = cluster.get(emulator.POOLS, NS, "stt")
    assert pool is not None and pool["spec"]["slots"] == 40
    assert checks.replicas(cluster) == 5
    await checks.beat(redis_server.url, "stt-0", 8, 8)
    await checks.beat(redis_server.url, "stt-x", 24, 24)
    await eventually(lambda: checks.assert_equal(checks.replicas(cluster), 1))
    await eventually(lambda: cluster.events(NS, "Autoscaled")[1])
    report = checks.pool_status(cluster)["autoscaling"]
    assert (report["desiredSlots"], report["recommendedSlots"]) == (8, 8)
    assert report["limitedBy"] == "MinSlots" and "lastScaleTime" in report
    await cluster.patch(kube.POOLS, NS, "stt", {"spec": {"autoscaling": {"enabled": False}}})
    await eventually(lambda: checks.assert_equal(
        "autoscaling" in checks.pool_status(cluster), False))


async def test_a_keyed_pools_pods_get_the_routers_token_and_the_key_file(
    cluster: emulator.Cluster, operator: KopfRunner
) -> None:
    """Pods of a pool with API keys admit the routers by their token (the router checks
    the key, it never forwards it): without the token every client would be refused."""
    auth = {"apiKeysSecret": {"name": "keys"}, "podTokenSecret": {"name": "tok"}}
    found = await checks.created(cluster, auth=auth)
    pod = found["deployments"]["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    token = {"secretKeyRef": {"name": "tok", "key": "token"}}
    assert {"name": "ASRPOOL_POD_TOKEN", "valueFrom": token} in server["env"]
    assert found["configmaps"]["data"]["ASRPOOL_API_KEYS_FILE"] == "/etc/asrpool/keys/keys.yaml"
    assert {"name": "api-keys", "secret": {"secretName": "keys"}} in pod["volumes"]


@pytest.mark.parametrize("operator_settings", [{"pod_token_seed": "chart-seed"}], indirect=True)
async def test_a_seeded_operator_writes_each_pools_own_pod_token(
    cluster: emulator.Cluster, operator: KopfRunner
) -> None:
    """The pool's token, derived as the routers derive it, in a Secret of the pool that
    its pods read; a keyed pool needs no podTokenSecret of its own."""
    found = await checks.created(cluster, auth={"apiKeysSecret": {"name": "keys"}})
    (server,) = found["deployments"]["spec"]["template"]["spec"]["containers"]
    token = {"secretKeyRef": {"name": "stt-pod-token", "key": "token"}}
    assert {"name": "ASRPOOL_POD_TOKEN", "valueFrom": token} in server["env"]
    secret = cluster.get(emulator.SECRETS, NS, "stt-pod-token")
    assert secret is not None
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "StreamingASRPool"
    sent = base64.b64decode(secret["data"]["token"]).decode()
    assert sent == seeds.pod_token("chart-seed", f"{NS}/stt")
    degraded = await eventually(lambda: checks.condition(cluster, "Degraded"))
    assert degraded["status"] == "False"


async def test_a_keyed_pool_without_a_pod_token_is_degraded_and_gets_no_pods(
    cluster: emulator.Cluster, operator: KopfRunner
) -> None:
    await cluster.create(checks.manifest(auth={"apiKeysSecret": {"name": "keys"}}))
    degraded = await eventually(lambda: checks.assert_degraded(cluster))
    assert "spec.auth.apiKeysSecret needs spec.auth.podTokenSecret" in degraded["message"]
    assert cluster.get(emulator.DEPLOYMENTS, NS, "stt") is None
