"""Does a live object already say what we built? (the test for "nothing to change").

The API server adds defaults, status and bookkeeping to what it stores, and writes
resource quantities in canonical form ("0.5" comes back as "500m"), so a live object is
compared as a superset of the built one: every built field must be there with the same
value (quantities by their amount); lists must have the same length and match item by
item.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from kubernetes.utils import quantity

from asrpool.operator import naming

QUANTITY_MAPS = ("requests", "limits")


def contains(actual: Any, desired: Any, key: str = "") -> bool:
    if isinstance(desired, Mapping):
        same = _same_amount if key in QUANTITY_MAPS else contains
        return isinstance(actual, Mapping) and all(
            name in actual and same(actual[name], value, name) for name, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(desired)
            and all(contains(a, d) for a, d in zip(actual, desired, strict=True))
        )
    return bool(actual == desired)


def _same_amount(actual: Any, desired: Any, name: str = "") -> bool:
    """Two quantities of a resource, equal by amount ("0.5" and "500m")."""
    try:
        return bool(quantity.parse_quantity(actual) == quantity.parse_quantity(desired))
    except (ValueError, TypeError):
        return False


def with_digest(desired: Mapping[str, Any]) -> dict[str, Any]:
    """``desired`` with a digest of itself in an annotation: a live child whose digest
    differs was built from another spec, even where it still has every desired field."""
    text = json.dumps(desired, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    meta = dict(desired["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), naming.APPLIED_ANNOTATION: digest}
    return {**desired, "metadata": meta}
