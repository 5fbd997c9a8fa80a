"""The real commands start with the rendered environment: ``asrpool route`` and
``asrpool operator`` run as processes with the variables the chart gives them (only
addresses swapped for local ones), answer their probes, do their job, and stop on
SIGTERM within the pod's termination grace."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import websockets

from asrpool.common.processes import StartError, free_port, spawn, wait_until
from asrpool.operator import children, pools
from asrpool.operator import cli as operator_cli
from tests.chart import emulated, rendering
from tests.chart.containers import Environ, parse, resolve_env
from tests.chart.scenarios import SCENARIOS
from tests.operator import emulator
from tests.operator.conftest import cluster  # noqa: F401
from tests.support import redis_servers

pytestmark = pytest.mark.timeout(120)
ASRPOOL = Path(sys.executable).parent / "asrpool"


class Process:
    """A rendered container's command run here, its output kept for failures."""

    def __init__(self, container: dict[str, Any], env: dict[str, str], log: Path) -> None:
        command = [str(ASRPOOL), *container["command"][1:], *container.get("args", [])]
        assert container["command"][0] == "asrpool"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("ASRPOOL_")}
        self.log = log
        self.child = spawn(container["name"], command, log, env={**clean, **env})
        self.process = self.child.process

    def output(self) -> str:
        return self.log.read_text()[-4000:]

    def wait_for(self, url: str, timeout: float = 60.0) -> None:
        try:
            wait_until(lambda: status(url) == 200, timeout, url, [self.child], 0.1)
        except StartError as exc:
            pytest.fail(f"{exc}:\n{self.output()}")

    def terminate(self, grace: float) -> int:
        """SIGTERM, as the kubelet sends it; the exit status, within ``grace`` seconds."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            pytest.fail(f"still running {grace} s after SIGTERM:\n{self.output()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.kill()


def http_probe(container: dict[str, Any], probe: str, port: int) -> str:
    return f"http://127.0.0.1:{port}{container[probe]['httpGet']['path']}"


async def test_the_router_runs_with_its_rendered_environment(
    tmp_path: Path, redis_server: redis_servers.RedisServer, processes: list[Process],
) -> None:
    manifests = rendering.render(SCENARIOS["api-keys"])
    router = rendering.deployment(manifests, "router")
    container = rendering.container(router)
    secret = rendering.one(manifests, "Secret", "demo-asrpool-api-keys")
    keys = tmp_path / "clients.yaml"  # the Secret, as the volume mounts it
    keys.write_text(secret["stringData"]["clients.yaml"])
    port = free_port()
    env = {**resolve_env(container), "ASRPOOL_REDIS_URL": redis_server.url,
           "ASRPOOL_HOST": "127.0.0.1", "ASRPOOL_PORT": str(port),
           "ASRPOOL_API_KEYS_FILE": str(keys)}
    process = Process(container, env, tmp_path / "router.log")
    processes.append(process)
    await asyncio.to_thread(process.wait_for, http_probe(container, "readinessProbe", port))
    assert status(http_probe(container, "livenessProbe", port)) == 200

    hook = rendering.one(manifests, "Pod")["spec"]["containers"][0]  # `helm test`
    script, service_url = hook["args"]
    assert service_url.endswith(container["readinessProbe"]["httpGet"]["path"])
    done = await asyncio.to_thread(subprocess.run, [
        sys.executable, "-c", script, f"http://127.0.0.1:{port}/readyz"],
        capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "200 {'ready': True" in done.stdout

    url = f"ws://127.0.0.1:{port}/api/asr-streaming"
    with pytest.raises(websockets.InvalidStatus) as refused:  # the key file is loaded
        async with websockets.connect(url):
            pass
    assert refused.value.response.status_code == 401

    pod = router["spec"]["template"]["spec"]
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    grace = pod["terminationGracePeriodSeconds"] - sleep
    # uvicorn shuts down cleanly, then re-raises the signal: the exit is SIGTERM's (143).
    assert await asyncio.to_thread(process.terminate, grace) in {0, -signal.SIGTERM}
    assert "Application shutdown complete" in process.output()


async def test_the_operator_runs_with_its_rendered_environment(
    tmp_path: Path, redis_server: redis_servers.RedisServer, processes: list[Process],
    cluster: emulator.Cluster,  # noqa: F811
) -> None:
    # Watching the emulator's namespace, standalone: the emulator serves no kopf peering
    # objects (two replicas peering are tested on the real control plane).
    manifests = rendering.render({"pools": {"namespaces": [emulator.NAMESPACE]},
                                  "operator": {"peering": ""}})
    operator = rendering.deployment(manifests, "operator")
    container = rendering.container(operator)
    env = resolve_env(container)
    port = free_port()
    liveness = env["ASRPOOL_LIVENESS_ENDPOINT"].replace(":8081/", f":{port}/")
    assert liveness != env["ASRPOOL_LIVENESS_ENDPOINT"]
    env |= {"ASRPOOL_REDIS_URL": redis_server.url, "ASRPOOL_KUBE_API_URL": cluster.url,
            "ASRPOOL_LIVENESS_ENDPOINT": liveness}
    process = Process(container, env, tmp_path / "operator.log")
    processes.append(process)
    await asyncio.to_thread(process.wait_for, http_probe(container, "livenessProbe", port))

    pool = {"apiVersion": "asrpool.io/v1alpha1", "kind": "StreamingASRPool",
            "metadata": {"name": "stt", "namespace": emulator.NAMESPACE},
            "spec": {"model": {"name": "kyutai/stt-1b-en_fr"}, "slots": 16}}
    await emulated.retried(
        lambda: cluster.create(pool),
        lambda: cluster.get(emulator.POOLS, emulator.NAMESPACE, "stt") is not None)
    deployment = await deployment_built(cluster, process)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == env["ASRPOOL_DEFAULT_IMAGE"]
    margin = int(env["ASRPOOL_TERMINATION_MARGIN_SECONDS"])
    assert pod["terminationGracePeriodSeconds"] == 60 + margin  # the pool's default drain

    grace = operator["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    assert await asyncio.to_thread(process.terminate, grace) == 0


async def deployment_built(cluster: emulator.Cluster, process: Process,  # noqa: F811
                timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = cluster.get(emulator.DEPLOYMENTS, emulator.NAMESPACE, "stt")
        if found is not None:
            return found
        await asyncio.sleep(0.1)
    pytest.fail(f"the operator built no Deployment:\n{process.output()}")


async def test_a_server_pod_drains_and_stops_within_the_grace_the_operator_gives_it(
    tmp_path: Path, redis_server: redis_servers.RedisServer, processes: list[Process],
    environ: Environ,
) -> None:
    """The chart configures the operator, the operator builds the pod, the pod runs (the
    tiny CPU model) with that environment: on SIGTERM a stream keeps its slot through
    the drain, is then closed, and the pod exits 0 before its termination grace ends."""
    manifests = rendering.render(SCENARIOS["example-pool-cpu"])
    operator = rendering.container(rendering.deployment(manifests, "operator"))
    environ({**resolve_env(operator), "ASRPOOL_REDIS_URL": redis_server.url})
    config = operator_cli.load_settings(parse(operator))
    body = rendering.one(manifests, "StreamingASRPool")
    body["spec"] |= {"slotsPerPod": 2, "drainGracePeriodSeconds": 2}
    built = {c["kind"]: c for c in children.build_all(pools.from_body(body), config)}
    template = built["Deployment"]["spec"]["template"]
    server = template["spec"]["containers"][0]
    port = free_port()
    config_map = built["ConfigMap"]
    env = {**resolve_env(server, {config_map["metadata"]["name"]: config_map["data"]}),
           "ASRPOOL_HOST": "127.0.0.1",
           "ASRPOOL_PORT": str(port), "ASRPOOL_ADVERTISE_ADDRESS": f"127.0.0.1:{port}"}
    process = Process(server, env, tmp_path / "server.log")
    processes.append(process)
    await asyncio.to_thread(process.wait_for, http_probe(server, "readinessProbe", port), 90)

    async with websockets.connect(f"ws://127.0.0.1:{port}/api/asr-streaming") as stream:
        assert msgpack.unpackb(await stream.recv())["type"] == "Ready"
        process.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        last = msgpack.unpackb(await asyncio.wait_for(stream.recv(), 30))
        kept = time.monotonic() - signalled
    assert last["type"] == "Error" and last.get("code") == "draining", last
    assert kept >= 2 * 0.9  # the drain bound the pool asked for (a lower bound: load-safe)
    grace = template["spec"]["terminationGracePeriodSeconds"]
    assert grace == 2 + config.termination_margin_seconds
    assert await asyncio.to_thread(process.process.wait, grace) == 0
