"""Small pools and scenarios for the plan tests."""

from __future__ import annotations

from typing import Any

from asrpool.operator import pools
from asrpool.plan import simulating


def pool(slots_per_pod: int = 2, pods: int = 1, drain_grace: int = 60,
         **scaling: Any) -> pools.Pool:
    autoscaling = {"enabled": bool(scaling), "maxSlots": 1000, **scaling}
    return pools.from_body({"metadata": {"name": "p"}, "spec": {
        "model": {"name": "tiny"}, "slots": pods * slots_per_pod, "slotsPerPod": slots_per_pod,
        "drainGracePeriodSeconds": drain_grace, "autoscaling": autoscaling}})


def replay(plan: simulating.Plan, sessions: list[tuple[float, float]],
           horizon: float | None = None) -> simulating.Outcome:
    """Run ``sessions`` (start, duration) through a fresh simulation."""
    starts = [start for start, _ in sessions]
    durations = [duration for _, duration in sessions]
    return simulating.Simulation(plan).run([], [(starts, durations)], horizon)
