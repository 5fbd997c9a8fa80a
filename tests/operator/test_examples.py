"""The HPA and KEDA examples of docs/autoscaling.md drive a pool in slot units.

Both target the pool's scale subresource with ``AverageValue`` only: any other target
type multiplies the ready pod count and would write a pod count into ``spec.slots``.
(The HPA example also passes a server-side dry run: tests/cluster/test_operator.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from asrpool.operator import naming

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return document


def targets_the_pool(reference: dict[str, Any]) -> None:
    assert reference["apiVersion"] == f"{naming.GROUP}/{naming.VERSION}"
    assert reference["kind"] == naming.KIND


def test_the_hpa_example_is_valid_and_counts_slots() -> None:
    hpa = load("hpa.yaml")
    kubernetes_validate.validate(hpa, "1.30.0", strict=True)
    targets_the_pool(hpa["spec"]["scaleTargetRef"])
    metrics = hpa["spec"]["metrics"]
    assert metrics and {metric["type"] for metric in metrics} <= {"External", "Object"}
    kinds = [metric[metric["type"].lower()]["target"]["type"] for metric in metrics]
    assert kinds == ["AverageValue"] * len(metrics)
    assert hpa["spec"]["minReplicas"] >= 1


def test_the_keda_example_counts_slots() -> None:
    scaled = load("keda-scaledobject.yaml")
    targets_the_pool(scaled["spec"]["scaleTargetRef"])
    assert {trigger["metricType"] for trigger in scaled["spec"]["triggers"]} == {"AverageValue"}
