"""The pool-writers policy (crds/policy/pool-writers.yaml) on the real API server: each pool
is authorized against the user who writes it, by RBAC roles of the test's namespace.

Writers act through kubectl's impersonation (``--as``), so the API server's own
authorizer answers for them, as it would for a real user's token.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asrpool.common import processes
from tests.cluster.clusters import Cluster

POLICY = Path(__file__).resolve().parents[2] / "crds" / "policy" / "pool-writers.yaml"
IN_FORCE_TIMEOUT = 30.0
POOL_WRITER = "pool-writer"  # may write pools and get the Secret "readable"
POD_MAKER = "pod-maker"  # may write pools and create pods


def pool(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "asrpool.io/v1alpha1", "kind": "StreamingASRPool",
            "metadata": {"name": name},
            "spec": {"model": {"name": "tiny"}, "slots": 4, **spec}}


def secret_env(*names: str) -> list[dict[str, Any]]:
    return [{"name": f"E{index}", "valueFrom": {"secretKeyRef": {"name": name, "key": "k"}}}
            for index, name in enumerate(names)]


def write(cluster: Cluster, namespace: str, user: str, body: dict[str, Any],
          verb: str = "create") -> subprocess.CompletedProcess[str]:
    return cluster.kubectl(verb, "--namespace", namespace, "--as", user, "-f", "-",
                           stdin=json.dumps(body), check=False)


def grant(cluster: Cluster, namespace: str, user: str, role: str, *rule: str) -> None:
    cluster.kubectl("create", "role", role, "--namespace", namespace, *rule)
    cluster.kubectl("create", "rolebinding", role, "--namespace", namespace,
                    "--role", role, "--user", user)


@pytest.fixture
def writers(crd: None, cluster: Cluster, namespace: str) -> Iterator[str]:
    """The policy in force, and the namespace's two writers with their roles."""
    for secret in ("readable", "hidden"):
        cluster.kubectl("create", "secret", "generic", secret, "--namespace", namespace,
                        "--from-literal=k=v")
    grant(cluster, namespace, POOL_WRITER, "writer-pools", "--verb=*",
          "--resource=streamingasrpools.asrpool.io")
    grant(cluster, namespace, POOL_WRITER, "writer-readable", "--verb=get",
          "--resource=secrets", "--resource-name=readable")
    grant(cluster, namespace, POD_MAKER, "maker-pools", "--verb=*",
          "--resource=streamingasrpools.asrpool.io")
    grant(cluster, namespace, POD_MAKER, "maker-pods", "--verb=create", "--resource=pods")
    cluster.kubectl("apply", "-f", str(POLICY))
    try:
        _wait_in_force(cluster, namespace)
        yield namespace
    finally:
        cluster.kubectl("delete", "-f", str(POLICY), "--ignore-not-found")


def _wait_in_force(cluster: Cluster, namespace: str) -> None:
    """The API server compiles a new policy a moment after it is stored."""
    probe = pool("probe", serviceAccountName="default")

    def in_force() -> bool:
        if "pool-writers" in write(cluster, namespace, POOL_WRITER, probe, "create").stderr:
            return True
        cluster.kubectl("delete", "streamingasrpool", "probe", "--namespace", namespace,
                        "--ignore-not-found")
        return False

    try:
        processes.wait_until(in_force, IN_FORCE_TIMEOUT, "the pool-writers policy",
                             period=0.5)
    except processes.StartError:
        raise AssertionError("the pool-writers policy never came into force") from None


@pytest.mark.parametrize(("spec", "refused"), [
    ({"serviceAccountName": "asrpool-operator"}, "spec.serviceAccountName=asrpool-operator"),
    ({"automountServiceAccountToken": True}, "spec.automountServiceAccountToken=true"),
    ({"runtimeClassName": "nvidia"}, "spec.runtimeClassName=nvidia"),
    ({"priorityClassName": "system-node-critical"},
     "spec.priorityClassName=system-node-critical"),
    ({"volumes": [{"name": "etc", "hostPath": {"path": "/etc"}}]}, "spec.volumes[etc].hostPath"),
    ({"model": {"volume": {"hostPath": "/var/lib/kubelet"}}},
     "spec.model.volume.hostPath=/var/lib/kubelet"),
    ({"model": {"name": "kyutai/stt-1b-en_fr", "cache": {"type": "hostPath", "path": "/"}}},
     "spec.model.cache.path=/"),
])
def test_pod_level_reach_needs_a_writer_who_may_create_pods(
    cluster: Cluster, writers: str, spec: dict[str, Any], refused: str
) -> None:
    body = pool("reach", **spec)
    result = write(cluster, writers, POOL_WRITER, body)
    assert result.returncode != 0, "a pool writer gave a pool pod-level reach"
    assert f"{refused}: only a writer who may create pods in namespace {writers}" \
        in result.stderr, result.stderr
    assert POOL_WRITER in result.stderr
    made = write(cluster, writers, POD_MAKER, body, "create")
    assert made.returncode == 0, made.stderr


@pytest.mark.parametrize("spec", [
    {"env": secret_env("hidden")},
    {"envFrom": [{"secretRef": {"name": "hidden"}}]},
    {"volumes": [{"name": "s", "secret": {"secretName": "hidden"}}]},
    {"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "hidden"}}]}}]},
    {"imagePullSecrets": [{"name": "hidden"}]},
    {"auth": {"apiKeysSecret": {"name": "hidden"}, "podTokenSecret": {"name": "readable"}}},
    {"model": {"name": "kyutai/stt-1b-en_fr", "tokenSecret": {"name": "hidden"}}},
], ids=["env", "envFrom", "volume", "projected", "pull", "auth", "model-token"])
def test_a_pool_may_name_only_the_secrets_its_writer_may_get(
    cluster: Cluster, writers: str, spec: dict[str, Any]
) -> None:
    result = write(cluster, writers, POOL_WRITER, pool("secrets", **spec))
    assert result.returncode != 0, "a pool writer named a Secret they may not read"
    assert (f"the pool names secrets/hidden, which {POOL_WRITER} may not get in namespace "
            f"{writers}") in result.stderr, result.stderr
    readable = json.loads(json.dumps(spec).replace('"hidden"', '"readable"'))
    allowed = write(cluster, writers, POOL_WRITER, pool("secrets", **readable))
    assert allowed.returncode == 0, allowed.stderr


def test_claims_and_config_maps_are_checked_too(cluster: Cluster, writers: str) -> None:
    for spec, named in [
        ({"volumes": [{"name": "c", "persistentVolumeClaim": {"claimName": "data"}}]},
         "persistentvolumeclaims/data"),
        ({"envFrom": [{"configMapRef": {"name": "settings"}}]}, "configmaps/settings"),
        ({"model": {"volume": {"claimName": "weights"}}}, "persistentvolumeclaims/weights"),
    ]:
        result = write(cluster, writers, POOL_WRITER, pool("named", **spec))
        assert f"the pool names {named}, which {POOL_WRITER}" in result.stderr, result.stderr


def test_a_write_that_adds_more_than_eight_names_is_refused_whole(
    cluster: Cluster, writers: str
) -> None:
    """One authorizer check costs a third of an expression's budget: eight per write."""
    grant(cluster, writers, POOL_WRITER, "writer-all-secrets", "--verb=get",
          "--resource=secrets")
    eight = secret_env(*(f"s{index}" for index in range(8)))
    assert write(cluster, writers, POOL_WRITER, pool("eight", env=eight)).returncode == 0
    nine = secret_env(*(f"s{index}" for index in range(9)))
    result = write(cluster, writers, POOL_WRITER, pool("nine", env=nine))
    assert "this write adds 9 objects by name" in result.stderr, result.stderr
    assert "may add at most 8 in one write" in result.stderr


def test_an_update_is_checked_only_for_what_it_adds(cluster: Cluster, writers: str) -> None:
    body = pool("shared", env=secret_env("hidden"), serviceAccountName="default")
    made = write(cluster, writers, POD_MAKER, body)
    assert made.returncode == 0, made.stderr
    relabelled = cluster.kubectl("label", "streamingasrpool", "shared", "team=a",
                                 "--namespace", writers, "--as", POOL_WRITER, check=False)
    assert relabelled.returncode == 0, relabelled.stderr
    resized = cluster.kubectl("patch", "streamingasrpool", "shared", "--namespace", writers,
                              "--as", POOL_WRITER, "--type=merge", "-p",
                              '{"spec": {"slots": 8}}', check=False)
    assert resized.returncode == 0, resized.stderr
    widened = cluster.kubectl("patch", "streamingasrpool", "shared", "--namespace", writers,
                              "--as", POOL_WRITER, "--type=merge", "-p",
                              '{"spec": {"envFrom": [{"secretRef": {"name": "hidden2"}}]}}',
                              check=False)
    assert "the pool names secrets/hidden2" in widened.stderr, widened.stderr
    kept = cluster.get(writers, "streamingasrpool", "shared")["spec"]
    assert (kept["slots"], "envFrom" in kept) == (8, False)
