"""Put one built child in place: create it, patch it back, or leave it alone."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from asrpool.operator import diffs, kube


class Action(enum.Enum):
    CREATED = "Created"
    UPDATED = "Updated"
    UNCHANGED = "Unchanged"


async def apply(api: kube.Kube, desired: Mapping[str, Any]) -> Action:
    """Make the live object contain ``desired``; only call the API where it differs."""
    kind, meta = kube.kind_of(desired), desired["metadata"]
    live = await api.get(kind, meta["namespace"], meta["name"])
    if live is None:
        await api.create(kind, meta["namespace"], desired)
        return Action.CREATED
    if diffs.contains(live, desired):
        return Action.UNCHANGED
    await api.patch(kind, meta["namespace"], meta["name"], diffs.managed_patch(desired))
    return Action.UPDATED


def describe(desired: Mapping[str, Any]) -> str:
    return f"{desired['kind']} {desired['metadata']['namespace']}/{desired['metadata']['name']}"
