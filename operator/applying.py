"""Put one built child in place with server-side apply, or leave it alone.

The whole desired object is applied under the operator's field manager, so a field the
pool no longer asks for (a removed node selector, toleration or env entry) is removed
from the child, and nothing another manager added is touched.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from asrpool.operator import diffs, kube, naming


class Action(enum.Enum):
    CREATED = "Created"
    UPDATED = "Updated"
    UNCHANGED = "Unchanged"


async def apply(api: kube.Kube, desired: Mapping[str, Any]) -> Action:
    """Make the live object what ``desired`` says; call the API only where it differs:
    a field changed by someone else, or a change of what was built (its digest, kept in
    an annotation, tells a removed field apart from an unchanged one)."""
    kind, meta = kube.kind_of(desired), desired["metadata"]
    body = diffs.with_digest(desired)
    live = await api.get(kind, meta["namespace"], meta["name"])
    if live is not None and diffs.contains(live, body):
        return Action.UNCHANGED
    await api.apply(kind, meta["namespace"], meta["name"], body, naming.MANAGER)
    return Action.CREATED if live is None else Action.UPDATED


def describe(desired: Mapping[str, Any]) -> str:
    return f"{desired['kind']} {desired['metadata']['namespace']}/{desired['metadata']['name']}"
