"""values.yaml, values.schema.json and the scenarios agree; bad values are refused
before anything is rendered, each with a message that names the value."""

from __future__ import annotations

import json
from typing import Any

import helm_python
import pytest
import yaml

from tests.chart import rendering
from tests.chart.scenarios import SCENARIOS


def defaults() -> dict[str, Any]:
    found = yaml.safe_load((rendering.CHART / "values.yaml").read_text())
    assert isinstance(found, dict)
    return found


def schema() -> dict[str, Any]:
    found = json.loads((rendering.CHART / "values.schema.json").read_text())
    assert isinstance(found, dict)
    return found


def schema_leaves(node: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Paths of the values the schema declares: down to a ``$ref`` (a named type such as
    resources or labels) or a value that is not an object with fixed properties."""
    if "$ref" in node or node.get("type") != "object" or "properties" not in node:
        return {prefix}
    found: set[tuple[str, ...]] = set()
    for key, child in node["properties"].items():
        found |= schema_leaves(child, (*prefix, key))
    return found


VALUES = sorted(schema_leaves(schema()) - {("global",)})


def test_every_value_of_the_schema_has_a_default_in_values_yaml() -> None:
    missing = [".".join(path) for path in VALUES if not _has(defaults(), path)]
    assert missing == []


def test_values_yaml_holds_nothing_the_schema_does_not_type() -> None:
    assert schema()["additionalProperties"] is False
    rendering.chart().validate_schema(defaults())


def test_the_scenarios_change_every_value() -> None:
    """So that 'renders with each documented option' covers each one."""
    base = defaults()
    untouched = [".".join(path) for path in VALUES
                 if not any(_has(values, path) and _get(values, path) != _get(base, path)
                            for values in SCENARIOS.values())]
    assert untouched == []


BAD_VALUES = [
    ({"router": {"policy": "random"}}, "/router/policy", "'pack', 'spread'"),
    ({"routr": {"replicas": 2}}, "additional properties 'routr' not allowed", ""),
    ({"redis": {"enabled": False}}, "/redis/external/url", "minLength"),
    ({"redis": {"enabled": False, "external": {"url": "redis://:hunter2@redis:6379/0"}}},
     "/redis/external/url", "does not match pattern"),
    ({"auth": {"apiKeys": {"enabled": True, "keys": [{"id": "team", "sha256": "hunter2"}]}}},
     "/auth/apiKeys/keys/0/sha256", "does not match pattern '^[0-9a-f]{64}$'"),
    ({"router": {"autoscaling": {"minReplicas": 0}}}, "/router/autoscaling/minReplicas", "minimum"),
    ({"operator": {"resyncSeconds": "fast"}}, "/operator/resyncSeconds", "got string, want number"),
    ({"pools": {"namespaces": ["Speech_EU"]}}, "/pools/namespaces/0", "does not match pattern"),
    ({"examplePool": {"name": "x" * 51}}, "/examplePool/name", "maxLength"),
    ({"operator": {"serviceAccount": {"create": False}}}, "/operator/serviceAccount/name",
     "minLength"),
    ({"router": {"resumeGraceSeconds": 10}}, "/router/resumeGraceSeconds", "minimum"),
    ({"router": {"resources": {"requests": {"cpu": "lots"}}}},
     "/router/resources/requests/cpu", ""),
    ({"redis": {"sentinel": {"enabled": True, "downAfterMilliseconds": 100}}},
     "/redis/sentinel/downAfterMilliseconds", "minimum"),
    ({"redis": {"sentinel": {"masterName": "asrpool/0"}}}, "/redis/sentinel/masterName",
     "does not match pattern"),
]


@pytest.mark.parametrize(("values", "where", "why"), BAD_VALUES,
                         ids=[where for _, where, _ in BAD_VALUES])
def test_bad_values_are_refused_with_a_message_naming_them(
    values: dict[str, Any], where: str, why: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError) as refused:
        rendering.render(values)
    message = str(refused.value)
    assert where in message and why in message, message


RULES = [
    ({"router": {"autoscaling": {"minReplicas": 5, "maxReplicas": 3}}},
     "router.autoscaling.minReplicas (5) must not be above maxReplicas (3)"),
    ({"router": {"preStopSleepSeconds": 10, "drainGraceSeconds": 60,
                 "terminationGracePeriodSeconds": 72}},
     "router.terminationGracePeriodSeconds (72) must be at least preStopSleepSeconds + "
     "drainGraceSeconds + 5 (75)"),
    ({"redis": {"enabled": False, "sentinel": {"enabled": True},
                "external": {"url": "redis://redis.example.internal:6379/0"}}},
     "redis.sentinel.enabled runs the built-in Redis (redis.enabled) highly available"),
]


@pytest.mark.parametrize(("values", "message"), RULES,
                         ids=["hpa-bounds", "router-grace", "sentinel-needs-built-in"])
def test_rules_across_values_fail_the_render_with_a_message(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm_python.HelmError) as refused:
        rendering.render(values)
    assert message in str(refused.value)


def _has(tree: Any, path: tuple[str, ...]) -> bool:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return False
        tree = tree[key]
    return True


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def test_the_charts_icon_is_a_file_of_this_repository() -> None:
    """Chart.yaml names its icon by the repository's raw URL: the file is there."""
    chart = yaml.safe_load((rendering.CHART / "Chart.yaml").read_text())
    path = chart["icon"].split("/main/", 1)[1]
    assert (rendering.ROOT / path).is_file(), chart["icon"]
