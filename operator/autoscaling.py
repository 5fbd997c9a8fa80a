"""Autoscaling by slot use: keep a share of the slots free, without flapping.

Pure functions. The recommendation follows demand (active streams), never capacity, so
pods that are still starting do not feed back into it. Stabilisation works like the
HPA's: a rise takes the lowest recommendation of the scale-up window (it must last),
a fall takes the highest of the scale-down window (every recent peak is kept).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from asrpool.operator import pools


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float  # monotonic seconds
    slots: int  # the slots recommended then


def recommend(active_streams: int, pool: pools.Pool) -> int:
    """Slots that leave ``targetFreeFraction`` free, whole pods, within the bounds."""
    policy = pool.autoscaling
    wanted = math.ceil(active_streams / (1.0 - min(policy.target_free_fraction, 0.99)))
    whole_pods = pools.pods_for(wanted, pool.slots_per_pod) * pool.slots_per_pod
    return max(policy.min_slots, min(policy.max_slots, whole_pods))


def remember(history: Sequence[Sample], sample: Sample, pool: pools.Pool) -> list[Sample]:
    """The history with ``sample`` added and what no window needs any more dropped."""
    keep = max(pool.autoscaling.scale_up_seconds, pool.autoscaling.scale_down_seconds)
    return [old for old in history if sample.at - old.at <= keep] + [sample]


def decide(history: Sequence[Sample], now: float, current: int, pool: pools.Pool) -> int:
    """The slots to set now, given the recommendations so far (last one = now)."""
    policy = pool.autoscaling
    rise_to = min(_within(history, now, policy.scale_up_seconds))
    fall_to = max(_within(history, now, policy.scale_down_seconds))
    bounded = max(policy.min_slots, min(policy.max_slots, current))
    if bounded < rise_to:
        return rise_to
    if bounded > fall_to:
        return fall_to
    return bounded


def _within(history: Sequence[Sample], now: float, window: float) -> list[int]:
    recent = [sample.slots for sample in history if now - sample.at <= window]
    return recent or [history[-1].slots]
