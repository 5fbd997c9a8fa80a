"""Which same-named objects the operator may apply over: only its own children."""

from __future__ import annotations

from typing import Any

from asrpool.operator import applying, naming

POOL_UID = "pool-uid"


def desired() -> dict[str, Any]:
    return {"metadata": {"name": "stt-config", "ownerReferences": [
        {"uid": POOL_UID, "controller": True, "kind": "StreamingASRPool", "name": "stt"}]}}


def live(labels: dict[str, str] | None = None,
         owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "stt-config", "labels": labels or {},
                         "ownerReferences": owners or []}}


OURS = {naming.MANAGED_BY_LABEL: naming.MANAGER}


def test_our_label_and_the_pool_as_controller_is_ours() -> None:
    assert applying.owns(live(OURS, desired()["metadata"]["ownerReferences"]), desired())
    assert applying.owns(live(OURS), desired())  # ours, before adoption


def test_a_stranger_or_another_controllers_object_is_not_ours() -> None:
    assert not applying.owns(live(), desired())
    assert not applying.owns(live({naming.MANAGED_BY_LABEL: "helm"}), desired())
    other = [{"uid": "someone-else", "controller": True, "kind": "Deployment", "name": "x"}]
    assert not applying.owns(live(OURS, other), desired())
