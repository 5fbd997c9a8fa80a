"""How the node agent reads a container: pure functions, no cluster needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from asrpool_harness.localcluster import podspecs

DATA = {("configmap", "cfg"): {"A": "1", "B": "2"}, ("secret", "sec"): {"token": "s3cret"}}


def lookup(kind: str, name: str) -> dict[str, str] | None:
    return DATA.get((kind, name))


def test_expansion_follows_kubernetes_rules() -> None:
    env = {"A": "1"}
    assert podspecs.expand("x$(A)y", env) == "x1y"
    assert podspecs.expand("$(MISSING)", env) == "$(MISSING)"
    assert podspecs.expand("$$(A)", env) == "$(A)"


def test_env_from_then_env_each_referring_to_the_ones_before() -> None:
    container = {
        "name": "c",
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "P_"}],
        "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "URL", "value": "http://$(IP):$(P_A)"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
                {"name": "GONE", "valueFrom": {"secretKeyRef": {
                    "name": "nope", "key": "k", "optional": True}}}],
    }
    fields = podspecs.field_values({"metadata": {"name": "p"}, "spec": {}}, "127.0.10.2", "h")
    env = podspecs.environment(container, lookup, fields)
    assert env == {"P_A": "1", "P_B": "2", "IP": "127.0.10.2", "URL": "http://127.0.10.2:1",
                   "TOKEN": "s3cret"}


@pytest.mark.parametrize(("env", "message"), [
    ({"envFrom": [{"configMapRef": {"name": "absent"}}]}, 'configmap "absent" not found'),
    ({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "other"}}}]},
     'secret "sec" key "other" not found (env X)'),
    ({"env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}]},
     "unsupported fieldRef 'spec.bogus' in env X"),
])
def test_a_missing_reference_says_what_is_missing(env: dict[str, object], message: str) -> None:
    with pytest.raises(podspecs.ConfigError) as error:
        podspecs.environment({"name": "c", **env}, lookup, {})
    assert str(error.value) == message


def test_a_container_without_a_command_cannot_run_here() -> None:
    with pytest.raises(podspecs.ConfigError, match="has no command"):
        podspecs.command_line({"name": "c", "image": "x"}, {})
    assert podspecs.command_line({"name": "c", "command": ["a", "$(X)"], "args": ["-v"]},
                                 {"X": "b"}) == ["a", "b", "-v"]


def test_probes_read_named_ports_and_timings() -> None:
    container = {"name": "c", "ports": [{"name": "http", "containerPort": 8080}],
                 "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"},
                                    "periodSeconds": 2, "failureThreshold": 1}}
    probe = podspecs.probe(container, "readinessProbe")
    assert probe == podspecs.Probe("http", 8080, "/readyz", period=2.0, failure_threshold=1)
    assert podspecs.probe(container, "livenessProbe") is None
    with pytest.raises(podspecs.ConfigError, match="no port named 'metrics'"):
        podspecs.container_port(container, "metrics")


def test_paths_under_a_mount_point_become_the_volumes_folder(tmp_path: Path) -> None:
    container = {"name": "c", "volumeMounts": [{"name": "keys", "mountPath": "/etc/keys"}]}
    mounts = podspecs.Mounts.of(container, {"keys": tmp_path})
    assert mounts.rewrite("/etc/keys/k.yaml") == f"{tmp_path}/k.yaml"
    assert mounts.rewrite("--keys=/etc/keys") == f"--keys={tmp_path}"
    assert mounts.rewrite("/etc/keysfile") == "/etc/keysfile"
    with pytest.raises(podspecs.ConfigError, match="not defined in the pod"):
        podspecs.Mounts.of({"name": "c", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}, {})


def test_a_rewritten_path_is_not_rewritten_again(tmp_path: Path) -> None:
    """A hostPath volume whose folder lies under another mount point (/tmp here)."""
    container = {"name": "c", "volumeMounts": [{"name": "model", "mountPath": "/var/model"},
                                               {"name": "tmp", "mountPath": "/tmp"}]}
    host_folder = Path("/tmp/checkpoints/a")
    mounts = podspecs.Mounts.of(container, {"model": host_folder, "tmp": tmp_path / "scratch"})
    assert mounts.rewrite("/var/model/config.json") == "/tmp/checkpoints/a/config.json"
    assert mounts.rewrite("/tmp/x") == f"{tmp_path}/scratch/x"


def test_restart_back_off_doubles_up_to_its_cap() -> None:
    assert [podspecs.restart_delay(n) for n in (1, 2, 3, 10)] == [1.0, 2.0, 4.0, 30.0]
