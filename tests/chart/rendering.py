"""Render the chart offline (helm-python-sdk) and read the result as Kubernetes objects."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "asrpool"
RELEASE = "demo"
NAMESPACE = "asr-system"
Manifest = dict[str, Any]


@functools.cache
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)


def render_files(values: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Template file name (e.g. ``asrpool/templates/redis.yaml``) to rendered text."""
    return chart().render(dict(values or {}), name=RELEASE, namespace=NAMESPACE, is_install=True)


def render(values: Mapping[str, Any] | None = None) -> list[Manifest]:
    """Every object the chart installs with these values, CRDs excluded (``crds/``)."""
    manifests: list[Manifest] = []
    for name, text in sorted(render_files(values).items()):
        if name.endswith(".yaml"):
            manifests.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return manifests


def find(manifests: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [m for m in manifests
            if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)]


def one(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = find(manifests, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def deployment(manifests: list[Manifest], component: str) -> Manifest:
    """The Deployment of ``operator`` or ``router``, whatever the names."""
    found = [m for m in find(manifests, "Deployment")
             if m["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    assert len(found) == 1, f"expected one {component} Deployment, found {len(found)}"
    return found[0]


def container(manifest: Manifest) -> dict[str, Any]:
    containers: list[dict[str, Any]] = manifest["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def load_yaml(path: Path) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
