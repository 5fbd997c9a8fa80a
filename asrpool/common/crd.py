"""The ``StreamingASRPool`` schema the operator ships with, and its defaults applied as
the API server applies them.

The API server fills a pool's left-out fields from the CRD's ``default``\\ s; an API
server that did not (an older CRD, a pool stored before a default was added) must not
change what the operator builds. So the operator applies the same defaults from the same
CRD, which the wheel carries as package data (``asrpool.crds``): each default is written
once, in the CRD, and :mod:`~asrpool.operator.pools` reads a spec already defaulted. The
server's own ``--batch-size`` default is the pool's ``slotsPerPod`` default, from here.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
from collections.abc import Mapping
from typing import Any

import yaml

CRD_PACKAGE = "asrpool.crds"
CRD_FILE = "streamingasrpools.asrpool.io.yaml"
Schema = Mapping[str, Any]


@functools.cache
def pool_spec() -> Schema:
    """The schema of a pool's ``spec``, in the served version of the CRD."""
    text = importlib.resources.files(CRD_PACKAGE).joinpath(CRD_FILE).read_text("utf-8")
    (version,) = yaml.safe_load(text)["spec"]["versions"]
    spec: Schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def at(schema: Schema, *fields: str) -> Schema:
    """A nested object's schema: ``at(pool_spec(), "autoscaling")``."""
    for field in fields:
        schema = schema["properties"][field]
    return schema


def default(schema: Schema, field: str) -> Any:
    """One property's default (a copy): ``default(pool_spec(), "slotsPerPod")``."""
    return copy.deepcopy(schema["properties"][field]["default"])


def defaulted(schema: Schema, value: Any) -> Any:
    """``value`` with the schema's defaults filled in, as structural defaulting does: a
    property left out (or null, where it is not nullable) gets its default, and then the
    properties of each object and the items of each list present get theirs. A value of
    the wrong type is left as it is, for the reader to refuse by its path."""
    if isinstance(value, Mapping) and "properties" in schema:
        return {**value, **{name: defaulted(child, _own(child, name, value))
                            for name, child in schema["properties"].items()
                            if name in value or "default" in child}}
    if isinstance(value, list) and "items" in schema:
        return [defaulted(schema["items"], item) for item in value]
    return value


def _own(child: Schema, name: str, value: Mapping[str, Any]) -> Any:
    """The property as written, or its default where it is left out."""
    written = value.get(name)
    if written is None and "default" in child and not (name in value and child.get("nullable")):
        return copy.deepcopy(child["default"])
    return written
