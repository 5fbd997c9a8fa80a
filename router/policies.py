"""Placement: which pod of a pool gets a new stream. Pure functions of a snapshot.

The admission Lua script (:mod:`asrpool.router.scripts`) mirrors these functions
line for line, so that the choice made inside Redis is the one documented and tested
here; ``tests/router/test_policies.py`` checks that both agree on random snapshots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from typing import Literal

Policy = Literal["pack", "spread"]
POLICIES: tuple[Policy, ...] = ("pack", "spread")


@dataclasses.dataclass(frozen=True)
class PodLoad:
    """One pod as admission sees it: its slots and how many are taken, conservatively."""

    pod_id: str
    address: str
    total: int
    used: int
    draining: bool = False

    @property
    def free(self) -> int:
        return max(0, self.total - self.used)


def effective_used(reported_used: int, router_sessions: int) -> int:
    """Slots taken on a pod, as admission counts them.

    ``reported_used`` is what the pod's last heartbeat said; ``router_sessions`` is
    every session the routers hold (or keep for a resume) on the pod, counted from the
    moment it is reserved, before the pod has accepted it. Every stream the pod holds
    was placed by a router (the pod token keeps other clients out) and stays counted
    for as long as the pod may hold it for a resume, so the router count covers the
    pod's; the pod's count covers what Redis forgot in a restart, until renewals have
    rebuilt it. Where the two disagree the larger wins, and the pod stays the final
    arbiter (it refuses a stream it has no slot for, and the router tries elsewhere).
    """
    return max(reported_used, router_sessions)


def eligible(pods: Iterable[PodLoad], exclude: Collection[str] = ()) -> list[PodLoad]:
    """Pods that may take a new stream: not draining, a free slot, not excluded."""
    return [p for p in pods if not p.draining and p.free > 0 and p.pod_id not in exclude]


def choose_pod(
    pods: Iterable[PodLoad], policy: Policy, exclude: Collection[str] = ()
) -> PodLoad | None:
    """The pod to place a new stream on, or None when no pod has room.

    ``pack`` takes the busiest pod that still has room (fewest free slots), so that
    idle pods stay idle and can be scaled down; ``spread`` takes the emptiest (most
    free slots). Ties go to the smallest pod id, so the choice is deterministic.
    """
    candidates = eligible(pods, exclude)
    if not candidates:
        return None
    if policy == "pack":
        return min(candidates, key=lambda p: (p.free, p.pod_id))
    return min(candidates, key=lambda p: (-p.free, p.pod_id))


def free_slots(pods: Iterable[PodLoad], exclude: Collection[str] = ()) -> int:
    """Free slots of a pool: the number of waiters that may be admitted now."""
    return sum(p.free for p in eligible(pods, exclude))


def queue_may_admit(rank: int, free: int) -> bool:
    """First come, first served: the waiter at ``rank`` (0 = head) gets a slot only
    when there are more free slots than waiters before it. A request that does not
    wait ranks after every waiter."""
    return rank < free
