"""The CRD's own ``openAPIV3Schema`` as a JSON Schema, read the way the API server does.

A structural schema may not say ``additionalProperties: false`` next to ``properties``;
the API server instead drops unknown fields, or rejects them under strict field
validation (``kubectl``'s default since 1.27). :func:`strict` adds
``additionalProperties: false`` wherever the server would reject an unknown field, so
that jsonschema rejects the same manifests.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "streamingasrpools.asrpool.io.yaml"
EXAMPLES = sorted((ROOT / "crds" / "examples").glob("*.yaml"))
BAD_POOLS = sorted((Path(__file__).parent / "bad_pools").glob("*.yaml"))


def load_crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


def version(crd: dict[str, Any]) -> dict[str, Any]:
    (served,) = crd["spec"]["versions"]
    return served


def openapi(crd: dict[str, Any]) -> dict[str, Any]:
    return version(crd)["schema"]["openAPIV3Schema"]


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(schema)
    _close(result)
    return result


def _close(node: Any) -> None:
    if not isinstance(node, dict):
        return
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        node["additionalProperties"] = False
    for child in node.get("properties", {}).values():
        _close(child)
    for key in ("items", "additionalProperties"):
        _close(node.get(key))


def validator(crd: dict[str, Any] | None = None) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(strict(openapi(crd or load_crd())))


def errors(document: dict[str, Any]) -> list[jsonschema.ValidationError]:
    return list(validator().iter_errors(document))


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every schema node with its dotted path (``items`` as ``[]``)."""
    if not isinstance(node, dict):
        return []
    found = [(path, node)]
    for name, child in node.get("properties", {}).items():
        found += walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += walk(node["additionalProperties"], f"{path}.*")
    return found
