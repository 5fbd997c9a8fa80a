"""Autoscaling by slot use: keep a share of the slots free, without flapping.

Pure functions, the HPA's algorithm in slot units. The recommendation follows demand
(active streams, clients waiting and clients refused), never capacity, so pods that are
still starting do not feed back into it. Stabilisation works like the HPA's: a rise
takes the lowest recommendation of the scale-up window (it must last), a fall takes
the highest of the scale-down window (every recent peak is kept). Then the rate
policies of ``behavior`` bound the change per period, as the HPA's do: ``Pods`` counts
server pods (``slotsPerPod`` slots each), ``Percent`` the slots at the start of the
period, and ``selectPolicy`` picks the policy that allows the most (``Max``), the
least (``Min``) or no change at all (``Disabled``).

A fresh operator seeds the history with the pool's own ``spec.slots`` (:func:`seeded`):
after a restart nothing falls before a whole scale-down window of low demand has been
seen by this process.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from asrpool.operator import pools

# What decided the slots, as status.autoscaling.limitedBy says it.
AS_RECOMMENDED = "AsRecommended"
MIN_SLOTS = "MinSlots"
MAX_SLOTS = "MaxSlots"
SCALE_UP_STABILIZATION = "ScaleUpStabilization"
SCALE_DOWN_STABILIZATION = "ScaleDownStabilization"
SCALE_UP_POLICY = "ScaleUpPolicy"
SCALE_DOWN_POLICY = "ScaleDownPolicy"


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float  # monotonic seconds
    slots: int  # the slots recommended then


@dataclasses.dataclass(frozen=True)
class Change:
    at: float  # monotonic seconds
    slots: int  # the change the autoscaler made to spec.slots: + up, - down


@dataclasses.dataclass(frozen=True)
class Demand:
    """Streams that run or want to: the autoscaler's input."""

    active: int
    waiting: int = 0
    refused: int = 0

    @property
    def total(self) -> int:
        return self.active + self.waiting + self.refused


@dataclasses.dataclass(frozen=True)
class Decision:
    recommended: int  # slots for the demand now, within the bounds
    slots: int  # what to set spec.slots to
    limited_by: str  # why slots is not simply the demand in whole pods


@dataclasses.dataclass(frozen=True)
class State:
    """What one operator process remembers of one pool (kept in kopf's memo)."""

    samples: tuple[Sample, ...] = ()
    changes: tuple[Change, ...] = ()


def seeded(now: float, slots: int) -> State:
    """A fresh memory: the current spec counts as a recommendation made just now."""
    return State(samples=(Sample(now, slots),))


def step(state: State, demand: Demand, now: float, current: int, pool: pools.Pool
         ) -> tuple[State, Decision]:
    """One autoscaling pass: remember, stabilise, rate-limit. Returns the new memory."""
    recommended, bound = _bounded(demand.total, pool)
    samples = remember(state.samples, Sample(now, recommended), pool)
    stable = decide(samples, now, current, pool)
    changes = _recent(state.changes, now, _longest_period(pool))
    slots, limited = rate_limit(stable, current, changes, now, pool)
    if slots != current:
        changes = [*changes, Change(now, slots - current)]
    reason = limited or _stabilised(stable, recommended) or bound or AS_RECOMMENDED
    return State(tuple(samples), tuple(changes)), Decision(recommended, slots, reason)


def _stabilised(stable: int, recommended: int) -> str:
    if stable < recommended:
        return SCALE_UP_STABILIZATION
    if stable > recommended:
        return SCALE_DOWN_STABILIZATION
    return ""


def recommend(active_streams: int, pool: pools.Pool) -> int:
    """Slots that leave ``targetFreeFraction`` free, whole pods, within the bounds."""
    return _bounded(active_streams, pool)[0]


def _bounded(demand: int, pool: pools.Pool) -> tuple[int, str]:
    policy = pool.autoscaling
    wanted = math.ceil(demand / (1.0 - min(policy.target_free_fraction, 0.99)))
    whole_pods = _whole_pods(wanted, pool)
    if whole_pods > policy.max_slots:
        return policy.max_slots, MAX_SLOTS
    if whole_pods < policy.min_slots:
        return policy.min_slots, MIN_SLOTS
    return whole_pods, ""


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
    """The recommendations of the last ``window`` seconds, as the HPA's (``now - window``
    excluded), or the newest alone: a window of 0 is the recommendation now."""
    recent = [sample.slots for sample in history if now - sample.at < window]
    return recent or [history[-1].slots]


def rate_limit(desired: int, current: int, changes: Sequence[Change], now: float,
               pool: pools.Pool) -> tuple[int, str]:
    """``desired`` within what the scale-up or scale-down policies allow now."""
    behavior = pool.autoscaling.behavior
    if desired > current:
        limit = _up_limit(current, changes, now, behavior.scale_up, pool)
        return (limit, SCALE_UP_POLICY) if desired > limit else (desired, "")
    if desired < current:
        limit = _down_limit(current, changes, now, behavior.scale_down, pool)
        return (limit, SCALE_DOWN_POLICY) if desired < limit else (desired, "")
    return desired, ""


def _up_limit(current: int, changes: Sequence[Change], now: float, rules: pools.ScalingRules,
              pool: pools.Pool) -> int:
    """The most slots the scale-up policies allow; a pool at zero may always get one pod,
    and one below ``minSlots`` may always reach it."""
    if rules.select == "Disabled" or not rules.policies:
        return max(current, pool.autoscaling.min_slots)
    proposals = [_proposed_up(_period_start(current, changes, now, rule.period_seconds), rule,
                              pool) for rule in rules.policies]
    limit = min(proposals) if rules.select == "Min" else max(proposals)
    first_pod = pool.slots_per_pod if current == 0 else 0
    return max(limit, current, first_pod, pool.autoscaling.min_slots)


def _down_limit(current: int, changes: Sequence[Change], now: float, rules: pools.ScalingRules,
                pool: pools.Pool) -> int:
    """The fewest slots the scale-down policies allow (``Min``: the smallest change); one
    above ``maxSlots`` may always come back to it."""
    if rules.select == "Disabled" or not rules.policies:
        return min(current, pool.autoscaling.max_slots)
    proposals = [_proposed_down(_period_start(current, changes, now, rule.period_seconds), rule,
                                pool) for rule in rules.policies]
    limit = max(proposals) if rules.select == "Min" else min(proposals)
    return min(max(limit, 0), current, pool.autoscaling.max_slots)


def _proposed_up(start: int, rule: pools.ScalingPolicy, pool: pools.Pool) -> int:
    if rule.type == "Pods":
        return start + rule.value * pool.slots_per_pod
    return _whole_pods(math.ceil(start * (1 + rule.value / 100)), pool)


def _proposed_down(start: int, rule: pools.ScalingPolicy, pool: pools.Pool) -> int:
    if rule.type == "Pods":
        return start - rule.value * pool.slots_per_pod
    return _whole_pods(math.floor(start * (1 - rule.value / 100)), pool)


def _period_start(current: int, changes: Sequence[Change], now: float, period: float) -> int:
    """The slots at the start of the period: what the autoscaler changed since is undone."""
    return current - sum(change.slots for change in _recent(changes, now, period))


def _recent(changes: Sequence[Change], now: float, period: float) -> list[Change]:
    return [change for change in changes if now - change.at < period]


def _longest_period(pool: pools.Pool) -> float:
    behavior = pool.autoscaling.behavior
    rules = [*behavior.scale_up.policies, *behavior.scale_down.policies]
    return max((rule.period_seconds for rule in rules), default=0.0)


def _whole_pods(slots: int, pool: pools.Pool) -> int:
    return pools.pods_for(max(slots, 0), pool.slots_per_pod) * pool.slots_per_pod
