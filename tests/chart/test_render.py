"""The chart renders with every documented option, lints clean, and every object it
installs is valid for Kubernetes 1.30 and for the newest version kubernetes-validate knows."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from asrpool.operator import pools
from tests.chart import rendering
from tests.chart.scenarios import SCENARIOS

OLDEST = "1.30.0"
NEWEST = kubernetes_validate.utils.latest_version()
CUSTOM_KINDS = {"StreamingASRPool", "ServiceMonitor", "PrometheusRule", "HTTPRoute",
                "KopfPeering", "ClusterKopfPeering"}

# The fields of monitoring.coreos.com/v1 ServiceMonitor the chart uses, closed to typos.
# Hand-written (the Prometheus Operator's CRD is not vendored here): a narrow check.
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
            "properties": {
                "selector": {"type": "object", "additionalProperties": False,
                             "properties": {"matchLabels": {"type": "object"}}},
                "namespaceSelector": {"type": "object", "additionalProperties": False,
                                      "properties": {"any": {"type": "boolean"},
                                                     "matchNames": {"type": "array"}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False, "required": ["port"],
                    "properties": {
                        "port": {"type": "string"}, "path": {"type": "string"},
                        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                        "relabelings": {"type": "array", "items": {
                            "type": "object", "additionalProperties": False,
                            "properties": {"sourceLabels": {"type": "array"},
                                           "targetLabel": {"type": "string"}}}}}}},
            },
        },
    },
}


# The fields of monitoring.coreos.com/v1 PrometheusRule the chart uses (promtool checks
# the rules themselves: tests/chart/test_alerts.py).
PROMETHEUS_RULE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object"},
        "spec": {"type": "object", "additionalProperties": False, "required": ["groups"],
                 "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                     "type": "object", "additionalProperties": False,
                     "required": ["name", "rules"],
                     "properties": {"name": {"type": "string"}, "rules": {"type": "array"}}}}}},
    },
}


# The fields of gateway.networking.k8s.io/v1 HTTPRoute the chart uses.
HTTP_ROUTE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "gateway.networking.k8s.io/v1"},
        "kind": {"const": "HTTPRoute"},
        "metadata": {"type": "object"},
        "spec": {"type": "object", "additionalProperties": False,
                 "required": ["parentRefs", "rules"],
                 "properties": {
                     "parentRefs": {"type": "array", "minItems": 1,
                                    "items": {"type": "object", "required": ["name"]}},
                     "hostnames": {"type": "array", "items": {"type": "string"}},
                     "rules": {"type": "array", "items": {
                         "type": "object", "additionalProperties": False,
                         "properties": {"matches": {"type": "array"}, "backendRefs": {
                             "type": "array", "items": {
                                 "type": "object", "additionalProperties": False,
                                 "required": ["name", "port"],
                                 "properties": {"name": {"type": "string"},
                                                "port": {"type": "integer"}}}}}}}}},
    },
}


@functools.cache
def crd() -> dict[str, Any]:
    path = rendering.ROOT / "crds" / "streamingasrpools.asrpool.io.yaml"
    found = yaml.safe_load(path.read_text())
    assert isinstance(found, dict)
    return found


def pool_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def validate_builtin(manifest: rendering.Manifest, version: str) -> None:
    try:
        kubernetes_validate.validate(manifest, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(part) for part in exc.path)
        name = f"{manifest['kind']}/{manifest['metadata']['name']}"
        pytest.fail(f"{name} is invalid for Kubernetes {version} at {where}: {exc.message}")


def peering_schema(kind: str) -> dict[str, Any]:
    path = rendering.ROOT / "crds" / "kopf-peering.yaml"
    (found,) = [document for document in yaml.safe_load_all(path.read_text())
                if document["spec"]["names"]["kind"] == kind]
    schema: dict[str, Any] = found["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def validate_custom(manifest: rendering.Manifest) -> None:
    if manifest["kind"] == "StreamingASRPool":
        jsonschema.Draft7Validator(pool_schema()).validate(manifest)
        pools.from_body(manifest)  # the operator's own reader accepts it
    elif manifest["kind"] in {"KopfPeering", "ClusterKopfPeering"}:
        assert manifest["apiVersion"] == "kopf.dev/v1"
        jsonschema.Draft7Validator(peering_schema(manifest["kind"])).validate(manifest)
    elif manifest["kind"] == "PrometheusRule":
        jsonschema.Draft7Validator(PROMETHEUS_RULE).validate(manifest)
    elif manifest["kind"] == "HTTPRoute":
        jsonschema.Draft7Validator(HTTP_ROUTE).validate(manifest)
    else:
        jsonschema.Draft7Validator(SERVICE_MONITOR).validate(manifest)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_object_is_valid_for_the_oldest_and_newest_kubernetes(scenario: str) -> None:
    manifests = rendering.render(SCENARIOS[scenario])
    assert manifests
    seen: set[str] = set()
    for manifest in manifests:
        if manifest["kind"] in CUSTOM_KINDS:
            validate_custom(manifest)
            continue
        text = json.dumps(manifest, sort_keys=True)
        if text not in seen:
            seen.add(text)
            validate_builtin(manifest, OLDEST)
            validate_builtin(manifest, NEWEST)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_namespaced_object_names_its_namespace(scenario: str) -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering",
                      "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    for manifest in rendering.render(SCENARIOS[scenario]):
        meta = manifest["metadata"]
        assert len(meta["name"]) <= 63, meta["name"]
        assert ("namespace" in meta) == (manifest["kind"] not in cluster_scoped), meta["name"]


@pytest.mark.parametrize("version", [OLDEST, NEWEST])
def test_lint_is_clean_in_strict_mode_with_every_scenario(version: str) -> None:
    for scenario, values in SCENARIOS.items():
        report = helm_python.lint(rendering.CHART, values, strict=True, kube_version=f"v{version}")
        assert (report["messages"], report["errors"]) == ([], []), scenario


@pytest.mark.parametrize("name", ["streamingasrpools.asrpool.io.yaml", "kopf-peering.yaml"])
def test_the_chart_ships_the_repository_crds_unchanged(name: str) -> None:
    ours = (rendering.CHART / "crds" / name).read_bytes()
    theirs = (rendering.ROOT / "crds" / name).read_bytes()
    assert ours == theirs, f"copy crds/{name} into charts/asrpool/crds/"
    assert sorted(c["filename"] for c in rendering.chart().crds) == [
        "asrpool/crds/kopf-peering.yaml", "asrpool/crds/streamingasrpools.asrpool.io.yaml"]


def test_the_chart_ships_the_repository_pool_writers_policy_unchanged() -> None:
    ours = (rendering.CHART / "policy" / "pool-writers.yaml").read_bytes()
    theirs = (rendering.ROOT / "crds" / "policy" / "pool-writers.yaml").read_bytes()
    assert ours == theirs, "copy crds/policy/pool-writers.yaml into charts/asrpool/policy/"


@pytest.mark.parametrize("enabled", [True, False])
def test_the_pool_writers_policy_is_named_after_the_release_and_can_be_left_out(
    enabled: bool
) -> None:
    values = {**SCENARIOS[next(iter(SCENARIOS))], "poolWriterPolicy": {"enabled": enabled}}
    found = {(m["kind"], m["metadata"]["name"], m["spec"].get("policyName"))
             for m in rendering.render(values) if m["kind"].startswith("ValidatingAdmission")}
    policy = f"{rendering.RELEASE}-asrpool-pool-writers"
    assert found == ({("ValidatingAdmissionPolicy", policy, None),
                      ("ValidatingAdmissionPolicyBinding", policy, policy)} if enabled else set())


@pytest.mark.parametrize("version", [OLDEST, NEWEST])
def test_the_crd_is_valid(version: str) -> None:
    validate_builtin(crd(), version)


def test_workloads_run_as_non_root_with_read_only_root_and_resources() -> None:
    workloads = [m for m in rendering.render() if m["kind"] in {"Deployment", "StatefulSet"}]
    assert {m["metadata"]["name"] for m in workloads} == {
        "demo-asrpool-operator", "demo-asrpool-router", "demo-asrpool-redis"}
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        main = rendering.container(workload)
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        assert main["resources"]["requests"]["cpu"]
        assert main["resources"]["limits"]["memory"]


@pytest.mark.parametrize("workers", [1, 2])
def test_the_router_has_a_writable_tmp_under_its_read_only_root(workers: int) -> None:
    """Several workers share metrics through files in a fresh folder under /tmp
    (router.sharedmetrics); with a read-only root that folder must be a volume."""
    router = rendering.one(rendering.render({"router": {"workers": workers}}), "Deployment",
                           "demo-asrpool-router")
    pod = router["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in rendering.container(router)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


@pytest.mark.parametrize("version", [OLDEST, NEWEST])
def test_the_kubernetes_validate_command_passes_the_rendered_chart(
    version: str, tmp_path: Path
) -> None:
    """The same check as a user runs it, on `helm template`-like output with the CRD."""
    values = {**SCENARIOS["namespaced-operator"], "examplePool": {"enabled": True}}
    documents = [crd(), *rendering.render(values)]
    path = tmp_path / "chart.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    command = Path(sys.executable).parent / "kubernetes-validate"
    done = subprocess.run([str(command), "--strict", "--quiet", "-k", version, str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    warned = set(re.findall(r"Couldn't find schema for kind (\w+)", done.stdout))
    # Checked by validate_custom instead (a namespaced operator peers in KopfPeerings;
    # this scenario has no alert rules).
    assert warned == CUSTOM_KINDS - {"ClusterKopfPeering", "PrometheusRule", "HTTPRoute"}


@pytest.mark.parametrize("example", sorted(p.stem for p in (rendering.ROOT / "crds/examples").glob(
    "*.yaml")))
def test_the_server_objects_the_operator_builds_are_valid_too(example: str) -> None:
    """Not the chart's objects, but what installing it leads to: each example pool's
    children, built by the operator as the chart configures it."""
    from asrpool.operator import children
    from asrpool.operator import settings as operator_settings

    (body,) = rendering.load_yaml(rendering.ROOT / "crds/examples" / f"{example}.yaml")
    body["metadata"].setdefault("namespace", "speech")
    config = operator_settings.OperatorSettings(all_namespaces=True)
    for child in children.build_all(pools.from_body(body), config):
        validate_builtin(child, OLDEST)
        validate_builtin(child, NEWEST)


def test_the_packaged_chart_renders_the_same_as_the_directory(tmp_path: Path) -> None:
    """What `helm package` ships (.helmignore applied) holds the CRD, the dashboard and
    every template."""
    archive = helm_python.package(rendering.CHART, destination=tmp_path)
    packaged = helm_python.Chart.load(archive)
    assert [c["filename"] for c in packaged.crds] == [c["filename"] for c in rendering.chart().crds]
    values = {"auth": {"podToken": {"existingSecret": "token"},  # nothing random
                       "apiKeys": {"existingSecret": "keys"}},
              "redis": {"auth": {"existingSecret": "redis-password"}}}
    ours = rendering.chart().render(values, name=rendering.RELEASE, namespace=rendering.NAMESPACE,
                                    is_install=True)
    theirs = packaged.render(values, name=rendering.RELEASE, namespace=rendering.NAMESPACE,
                             is_install=True)
    assert theirs == ours
