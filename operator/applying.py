"""Put one built child in place with server-side apply, or leave it alone.

The whole desired object is applied under the operator's field manager, so a field the
pool no longer asks for (a removed node selector, toleration or env entry) is removed
from the child, and nothing another manager added is touched. A same-named object that
is not the pool's (no managed-by label of ours, or another controller's) is never taken
over: the pool reports ``NameConflict`` instead. An apply the API server refuses (an
immutable field such as a Deployment's selector or a Service's ``clusterIP``, a value
it rejects, a forbidden call) is reported with the server's message (``ApplyFailed``)
and tried again at the next resync, not in a tight loop; the other children are still
applied.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, NamedTuple

from asrpool.operator import diffs, kube, naming


class Action(enum.Enum):
    CREATED = "Created"
    UPDATED = "Updated"
    UNCHANGED = "Unchanged"
    REFUSED = "Refused"  # a same-named object the operator does not own: left untouched
    FAILED = "Failed"  # the API server refused the apply (see Applied.error)


# Refusals that the same request will meet again: not worth a quick retry. Anything
# else (no answer, 5xx, 404 of a namespace being deleted, 409, 429) is retried soon.
REFUSED_BY_SERVER = {400, 403, 422}


class Applied(NamedTuple):
    child: dict[str, Any]
    action: Action
    error: str = ""  # the API server's message, for FAILED


def owns(live: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether ``live`` is this pool's child: our managed-by label, and no controller
    owner but the pool (``desired`` carries the pool's owner reference)."""
    meta = live.get("metadata") or {}
    if (meta.get("labels") or {}).get(naming.MANAGED_BY_LABEL) != naming.MANAGER:
        return False
    ours = {ref.get("uid") for ref in desired["metadata"].get("ownerReferences") or []}
    controllers = [ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")]
    return all(ref.get("uid") in ours for ref in controllers)


async def apply_all(api: kube.Kube, built: list[dict[str, Any]]) -> list[Applied]:
    """Apply every child, or none: if a same-named object is not ours, nothing is applied
    (a Deployment must never read a stranger's ConfigMap) and those are reported."""
    lives = [await _live(api, desired) for desired in built]
    refused = [Applied(desired, Action.REFUSED) for desired, live in zip(built, lives, strict=True)
               if live is not None and not owns(live, desired)]
    if refused:
        return refused
    return [await _apply_or_report(api, desired, live)
            for desired, live in zip(built, lives, strict=True)]


async def _apply_or_report(api: kube.Kube, desired: dict[str, Any],
                           live: Mapping[str, Any] | None) -> Applied:
    try:
        return Applied(desired, await apply(api, desired, live))
    except kube.KubeError as exc:
        if exc.status not in REFUSED_BY_SERVER:
            raise
        return Applied(desired, Action.FAILED, str(exc))


async def apply(api: kube.Kube, desired: Mapping[str, Any],
                live: Mapping[str, Any] | None) -> Action:
    """Make the live object what ``desired`` says; call the API only where it differs:
    a field changed by someone else, or a change of what was built (its digest, kept in
    an annotation, tells a removed field apart from an unchanged one)."""
    kind, meta = kube.kind_of(desired), desired["metadata"]
    body = diffs.with_digest(desired)
    if live is not None and diffs.contains(live, body):
        return Action.UNCHANGED
    await api.apply(kind, meta["namespace"], meta["name"], body, naming.MANAGER)
    return Action.CREATED if live is None else Action.UPDATED


async def _live(api: kube.Kube, desired: Mapping[str, Any]) -> dict[str, Any] | None:
    meta = desired["metadata"]
    return await api.get(kube.kind_of(desired), meta["namespace"], meta["name"])


def describe(desired: Mapping[str, Any]) -> str:
    return f"{desired['kind']} {desired['metadata']['namespace']}/{desired['metadata']['name']}"
