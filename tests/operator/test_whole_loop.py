"""The whole loop without a cluster: operator, emulator, real pods, Redis, router, client.

A pool is created in the emulator; the real operator builds its Deployment; the
:mod:`kubelet` stand-in runs each pod as a real ``asrpool serve --model tiny`` process
from the pod template; the pods heartbeat to Redis and the pool's status shows their
slots; a client streams through a real ``asrpool route``. Then the slots are lowered:
the operator marks the pods from their live slot use, the idle pod is the one removed,
and the busy pod's stream runs to its end without an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner

from asrpool.common import processes, registry
from asrpool.common.processes import free_port
from asrpool.operator import kube, naming
from tests.operator import checks, emulator, kubelet
from tests.support import kyutai_client, redis_servers
from tests.support.polling import eventually

NS = emulator.NAMESPACE
pytestmark = pytest.mark.timeout(240)
STARTUP = 90.0  # two tiny-model pods and a router starting on a shared 2-core machine
WAIT = 60.0  # any later step, on the same loaded machine
log = logging.getLogger(__name__)


@pytest.fixture
def router(redis_server: redis_servers.RedisServer, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    route = processes.spawn(
        "asrpool route",
        [sys.executable, "-m", "asrpool.cli", "route", "--redis-url", redis_server.url,
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
         "--pool-namespace", NS],  # as the chart sets it
        tmp_path / "router.log")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        route.stop(30)


@pytest.fixture
async def pods(cluster: emulator.Cluster, tmp_path: Path) -> AsyncIterator[kubelet.Kubelet]:
    node = kubelet.Kubelet(cluster, NS, "stt", tmp_path)
    task = asyncio.create_task(node.run())
    try:
        yield node
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.to_thread(node.shutdown)
        for pod in [*node.running.values(), *node.terminated.values()]:
            log.warning("pod %s (exit %s):\n%s", pod.name, pod.process.poll(),
                        pod.log.read_text(errors="replace")[-3000:])


def answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/healthz", timeout=1) as response:
            return int(response.status) == 200
    except OSError:
        return False


async def test_scale_down_removes_the_idle_pod_and_keeps_the_stream(
    cluster: emulator.Cluster, operator: KopfRunner, pods: kubelet.Kubelet, router: str,
    redis_server: redis_servers.RedisServer,
) -> None:
    await cluster.create(checks.manifest(slots=2, slotsPerPod=1, model={"name": "tiny"},
                                         resources={"gpus": 0}, drainGracePeriodSeconds=10))

    def serving(slots: int, free: int) -> dict[str, Any]:
        status = checks.pool_status(cluster)
        assert (status.get("slots"), status.get("freeSlots")) == (slots, free), status
        return status

    await eventually(lambda: serving(2, 2), STARTUP)
    await eventually(lambda: checks.assert_equal(answers(router), True), STARTUP)
    members = redis_server.client().hgetall(registry.pool_members_key(f"{NS}/stt"))
    assert members == {registry.MEMBERS_SENTINEL: "", **{  # the routers admit to these only
        naming.pod_id(NS, name): pod.ip for name, pod in pods.running.items()}}

    url = f"ws://{router}/api/asr-streaming?pool=stt"
    async with kyutai_client.paced_stream(url, WAIT, timeout=200) as stream:
        await eventually(lambda: serving(2, 1), WAIT)
        use = await redis_servers.used_slots(redis_server.url, f"{NS}/stt")
        (busy,) = [pod_id.partition("/")[2] for pod_id, used in use.items() if used]
        (idle,) = set(pods.running) - {busy}

        await cluster.patch(kube.POOLS, NS, "stt", {"spec": {"slots": 1}})
        await eventually(lambda: checks.assert_equal(checks.replicas(cluster), 1), WAIT)
        await eventually(lambda: checks.assert_equal(set(pods.terminated), {idle}), WAIT)
        assert await asyncio.to_thread(pods.terminated[idle].process.wait, 30) == 0
        assert set(pods.running) == {busy}
        assert pods.running[busy].process.poll() is None
        assert stream.is_open()  # audio still flowing
        transcript = await stream.finish()
    assert [m for m in transcript if m["type"] == "Error"] == []
    assert (transcript[-1]["type"], transcript[-1]["id"]) == ("Marker", 0)
    await eventually(lambda: serving(1, 1), WAIT)


async def test_pods_that_measure_their_engine_size_the_pool(
    cluster: emulator.Cluster, operator: KopfRunner, pods: kubelet.Kubelet,
) -> None:
    """``slotsPerPod: auto``: one pod first; it measures its engine (batches up to 2 here,
    as the pool's env asks) and serves 2 slots; the operator then sizes the pool from
    that: 4 slots are two such pods, with the same template. One torch thread and the
    whole frame for a budget: a busy test machine must not make a tiny step miss it."""
    env = {"ASRPOOL_AUTO_MAX_BATCH": "2", "ASRPOOL_TORCH_THREADS": "1",
           "ASRPOOL_AUTO_STEP_BUDGET_MS": "80"}
    await cluster.create(checks.manifest(
        slots=4, slotsPerPod="auto", model={"name": "tiny"}, resources={"gpus": 0},
        env=[{"name": name, "value": value} for name, value in env.items()]))

    def sized() -> None:
        status = checks.pool_status(cluster)
        assert (status.get("slotsPerPod"), status.get("slotsPerPodFrom")) == (2, "measured")
        assert checks.replicas(cluster) == 2
        # Both serve what each measured: 2, or 1 where the machine was busy meanwhile.
        assert 3 <= status.get("slots", 0) <= 4 and len(pods.running) == 2, status

    await eventually(sized, STARTUP * 2)
