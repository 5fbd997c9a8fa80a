"""The CRD: valid for Kubernetes, structural, and it accepts exactly the right pools."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from asrpool.common import crd, limits
from asrpool.operator import naming, pools, specs
from asrpool.server import settings as server_settings
from tests.operator import schemas


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def test_the_crd_passes_kubernetes_validate_strict() -> None:
    kubernetes_validate.validate(schemas.load_crd(), "1.30.0", strict=True)


def test_the_rbac_passes_kubernetes_validate_strict() -> None:
    for document in yaml.safe_load_all((schemas.ROOT / "crds/rbac/operator.yaml").read_text()):
        kubernetes_validate.validate(document, "1.30.0", strict=True)


def test_the_crd_names_what_the_operator_watches() -> None:
    definition = schemas.load_crd()
    names = definition["spec"]["names"]
    assert definition["metadata"]["name"] == f"{naming.PLURAL}.{naming.GROUP}"
    assert (definition["spec"]["group"], names["kind"], names["plural"]) == (
        naming.GROUP, naming.KIND, naming.PLURAL)
    assert names["shortNames"] == ["asrpool"]
    assert schemas.version(definition)["name"] == naming.VERSION


def test_scale_maps_replicas_to_slots_with_a_selector() -> None:
    scale = schemas.version(schemas.load_crd())["subresources"]["scale"]
    assert scale == {"specReplicasPath": ".spec.slots", "statusReplicasPath": ".status.slots",
                     "labelSelectorPath": ".status.selector"}


def test_status_is_a_subresource() -> None:
    assert schemas.version(schemas.load_crd())["subresources"]["status"] == {}


def test_printer_columns_point_at_fields_of_the_schema() -> None:
    definition = schemas.load_crd()
    columns = {column["name"]: column["jsonPath"]
               for column in schemas.version(definition)["additionalPrinterColumns"]}
    assert {"Slots", "Free", "Ready", "Age"} <= set(columns)
    paths = {path for path, _ in schemas.walk(schemas.openapi(definition))}
    for name, json_path in columns.items():
        if not json_path.startswith(".metadata"):
            assert re.sub(r"\[\?.*?\]", "[]", json_path) in paths, name


# Core/v1 objects copied to the pods as written: the API server checks them when the
# operator applies the Deployment.
PASSED_THROUGH = {".spec.affinity", ".spec.env[].valueFrom", ".spec.envFrom[]",
                  ".spec.volumes[]", ".spec.topologySpreadConstraints[]"}


def test_the_schema_is_structural_and_closed() -> None:
    """Every field has a type, and only the pod-template pass-through keeps unknown fields."""
    for path, node in schemas.walk(schemas.openapi(schemas.load_crd())):
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path
        assert "additionalProperties" not in node or "properties" not in node, path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert path in PASSED_THROUGH, path


@pytest.mark.parametrize("path", schemas.EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_a_valid_pool(path: Path) -> None:
    document = _load(path)
    assert schemas.errors(document) == []
    pools.from_body({**document, "metadata": {"namespace": "default", **document["metadata"]}})


def test_there_are_examples() -> None:
    assert len(schemas.EXAMPLES) >= 3


def _expected_path(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    match = re.match(r"# rejects: (\S*)", first)
    assert match, f"{path.name} must start with '# rejects: PATH'"
    return "" if match.group(1).startswith("(") else match.group(1)


def _cel_only(path: Path) -> bool:
    return path.read_text().startswith("# rejects: (CEL:")


@pytest.mark.parametrize("path", schemas.BAD_POOLS, ids=lambda p: p.stem)
def test_a_bad_pool_is_rejected_where_it_is_wrong(path: Path) -> None:
    if _cel_only(path):
        # jsonschema cannot run CEL: the operator checks the same rule (and tests/cluster
        # holds the API server to it).
        document = _load(path)
        with pytest.raises(specs.InvalidSpec):
            pools.from_body({**document, "metadata": {"namespace": "default",
                                                      **document["metadata"]}})
        return
    errors = schemas.errors(_load(path))
    assert errors, f"{path.name} was accepted"
    where = {".".join(str(part) for part in error.absolute_path) for error in errors}
    assert _expected_path(path) in where, where


def test_there_is_a_bad_pool_for_each_listed_mistake() -> None:
    names = {path.stem for path in schemas.BAD_POOLS}
    assert {"negative-slots", "zero-slots-per-pod", "unknown-spec-field", "slots-as-string",
            "missing-model"} <= names


def _defaults(node: dict[str, Any]) -> dict[str, Any]:
    return {name: child["default"] for name, child in node["properties"].items()
            if "default" in child}


def test_the_operator_reads_the_crd_of_this_repository() -> None:
    """The wheel's copy (package data asrpool.crds) is the file in crds/."""
    assert crd.pool_spec() == schemas.openapi(schemas.load_crd())["properties"]["spec"]


def test_the_crd_bounds_slots_per_pod_as_the_server_does() -> None:
    """One bound for a pod's slots: the CRD's CEL rule states limits.MAX_SLOTS_PER_POD,
    which the server's --batch-size and the operator's own check take."""
    (rule,) = crd.at(crd.pool_spec(), "slotsPerPod")["x-kubernetes-validations"]
    most = limits.MAX_SLOTS_PER_POD
    assert f"self <= {most} :" in rule["rule"]
    assert f"from 1 to {most}, or auto" in rule["message"]
    assert most == server_settings.MAX_BATCH_SIZE
    chart = json.loads((schemas.ROOT / "charts/asrpool/values.schema.json").read_text())
    example = chart["properties"]["examplePool"]["properties"]
    assert example["slotsPerPod"]["oneOf"][0]["maximum"] == most
    assert example["slots"]["maximum"] == crd.at(crd.pool_spec(), "slots")["maximum"]


def test_the_operator_uses_the_crd_defaults() -> None:
    """An API server that skipped defaulting would get the same children."""
    spec = schemas.openapi(schemas.load_crd())["properties"]["spec"]
    given = pools.from_body({"metadata": {"name": "p"}, "spec": {
        "model": {"name": "kyutai/stt-1b-en_fr", "tokenSecret": {"name": "hf"}}, "slots": 1}})
    assert _defaults(spec) == {
        "slotsPerPod": given.slots_per_pod, "context": given.context,
        "imagePullPolicy": given.image_pull_policy, "drainGracePeriodSeconds":
        given.drain_grace_seconds, "resources": {},
        "dtype": given.dtype,
        "automountServiceAccountToken": given.template.automount_token}
    model = spec["properties"]["model"]["properties"]
    assert _defaults(spec["properties"]["model"]) == {
        "loadTimeoutSeconds": given.source.load_timeout_seconds}
    assert _defaults(model["cache"]) == {"type": given.source.cache.kind}
    assert model["cache"]["properties"]["sizeLimit"].get("default") is None  # the operator's
    assert given.source.token is not None
    assert _defaults(model["tokenSecret"]) == {"key": given.source.token.key}
    assert _defaults(spec["properties"]["resources"]) == {
        "gpus": given.gpus, "gpuResourceName": given.gpu_resource}
    scaling = _defaults(spec["properties"]["autoscaling"])
    assert scaling == {
        "enabled": given.autoscaling.enabled,
        "targetFreeFraction": given.autoscaling.target_free_fraction,
        "scaleUpStabilizationSeconds": given.autoscaling.scale_up_seconds,
        "scaleDownStabilizationSeconds": given.autoscaling.scale_down_seconds}
    assert given.autoscaling.min_slots == given.slots_per_pod  # no CRD default: one pod's
    assert "default" not in spec["properties"]["engineProcess"]  # the operator's, by GPUs


def test_behavior_left_out_is_the_hpas_default() -> None:
    given = pools.from_body({"metadata": {"name": "p"}, "spec": {
        "model": {"name": "tiny"}, "slots": 1, "autoscaling": {"behavior": {
            "scaleUp": {"selectPolicy": "Min"}}}}})
    up, down = given.autoscaling.behavior.scale_up, given.autoscaling.behavior.scale_down
    assert (up.select, up.policies) == ("Min", pools.DEFAULT_SCALE_UP.policies)
    assert down == pools.DEFAULT_SCALE_DOWN


def test_status_the_operator_writes_fits_the_schema() -> None:
    status_schema = schemas.openapi(schemas.load_crd())["properties"]["status"]
    assert set(status_schema["properties"]) >= {
        "observedGeneration", "replicas", "readyReplicas", "slots", "freeSlots",
        "activeStreams", "selector", "conditions"}


def test_the_crd_takes_the_one_dtype_vocabulary() -> None:
    """spec.dtype, --dtype (server settings) and the model loader share asrpool.common.dtypes."""
    from asrpool.common import dtypes
    from asrpool.server import models
    from asrpool.server import settings as server_settings

    spec = schemas.version(schemas.load_crd())["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert tuple(spec["properties"]["dtype"]["enum"]) == dtypes.DTYPES
    assert server_settings.ServerSettings.model_fields["dtype"].annotation == dtypes.Dtype
    for dtype in dtypes.DTYPES:
        models.resolve_dtype(dtype, "cpu")  # each one loads
    with pytest.raises(models.ModelError, match="expected one of auto, bfloat16"):
        models.resolve_dtype("int8", "cpu")


@pytest.mark.parametrize(("written", "expected"), [
    ({}, {"a": 1, "o": {"b": 2}, "n": 7}),  # a left-out object with a default, defaulted inside
    ({"a": None}, {"a": 1, "o": {"b": 2}, "n": 7}),  # null where not nullable: the default
    ({"n": None}, {"a": 1, "o": {"b": 2}, "n": None}),  # nullable: null stays
    ({"a": 5, "o": {"b": 6}, "n": 0}, {"a": 5, "o": {"b": 6}, "n": 0}),  # written values stay
    ({"n": 0, "l": [{}, {"c": 0}]}, {"a": 1, "o": {"b": 2}, "n": 0,
                                     "l": [{"c": 3}, {"c": 0}]}),  # each item
    ({"n": 0, "p": {}}, {"a": 1, "o": {"b": 2}, "n": 0, "p": {"d": 4}}),  # written only
    ({"n": 0, "a": "x", "l": "y"}, {"a": "x", "o": {"b": 2}, "n": 0, "l": "y"}),  # as written
])
def test_defaults_apply_as_the_api_server_applies_them(
        written: dict[str, Any], expected: dict[str, Any]) -> None:
    node = {"properties": {
        "a": {"type": "integer", "default": 1},
        "o": {"type": "object", "default": {}, "properties": {"b": {"default": 2}}},
        "n": {"type": "integer", "nullable": True, "default": 7},
        "l": {"type": "array", "items": {"properties": {"c": {"default": 3}}}},
        "p": {"type": "object", "properties": {"d": {"default": 4}}}}}
    assert crd.defaulted(node, written) == expected
