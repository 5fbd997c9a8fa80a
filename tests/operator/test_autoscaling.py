"""Autoscaling by slot use: the recommendation, the bounds, and the stabilisation."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from asrpool.operator import autoscaling, pools


def pool(**scaling: Any) -> pools.Pool:
    policy = {"enabled": True, "minSlots": 8, "maxSlots": 128, **scaling}
    return pools.from_body({"metadata": {"name": "p"}, "spec": {
        "model": {"name": "tiny"}, "slots": 16, "slotsPerPod": 8, "autoscaling": policy}})


def test_recommendation_keeps_the_target_free_in_whole_pods() -> None:
    assert autoscaling.recommend(30, pool(targetFreeFraction=0.25)) == 40  # 30/0.75, 5 pods
    assert autoscaling.recommend(0, pool()) == 8  # the floor
    assert autoscaling.recommend(1000, pool()) == 128  # the ceiling


@given(active=st.integers(0, 10_000), free=st.floats(0, 0.9))
def test_recommendation_is_within_bounds_and_leaves_room(active: int, free: float) -> None:
    scaled = pool(targetFreeFraction=free, maxSlots=100_000)
    slots = autoscaling.recommend(active, scaled)
    assert 8 <= slots <= 100_000 and slots % 8 == 0
    assert slots - active >= free * slots - 1e-6


def samples(*pairs: tuple[float, int]) -> list[autoscaling.Sample]:
    return [autoscaling.Sample(at, slots) for at, slots in pairs]


def test_a_rise_is_immediate_with_no_scale_up_window() -> None:
    scaled = pool(scaleUpStabilizationSeconds=0)
    assert autoscaling.decide(samples((0, 16), (10, 64)), 10, 16, scaled) == 64


def test_a_rise_must_last_the_scale_up_window() -> None:
    scaled = pool(scaleUpStabilizationSeconds=30)
    history = samples((0, 16), (10, 64))
    assert autoscaling.decide(history, 10, 16, scaled) == 16
    assert autoscaling.decide(history + samples((41, 64)), 41, 16, scaled) == 64


def test_a_fall_waits_for_the_scale_down_window() -> None:
    scaled = pool(scaleDownStabilizationSeconds=300)
    history = samples((0, 64), (100, 16), (200, 16))
    assert autoscaling.decide(history, 200, 64, scaled) == 64  # the peak is still recent
    later = history + samples((301, 16))
    assert autoscaling.decide(later[1:], 301, 64, scaled) == 16


def test_a_manual_value_out_of_bounds_is_brought_back() -> None:
    scaled = pool()
    assert autoscaling.decide(samples((0, 16)), 0, 1000, scaled) == 16
    assert autoscaling.decide(samples((0, 16)), 0, 0, scaled) == 16


def test_history_keeps_only_what_the_windows_need() -> None:
    scaled = pool(scaleUpStabilizationSeconds=10, scaleDownStabilizationSeconds=60)
    history = samples((0, 8), (50, 8), (100, 8))
    kept = autoscaling.remember(history, autoscaling.Sample(120, 16), scaled)
    assert [s.at for s in kept] == [100, 120]


@given(st.lists(st.integers(0, 500), min_size=1, max_size=40))
def test_no_flapping_inside_the_scale_down_window(demand: list[int]) -> None:
    """With a window longer than the run, slots never fall."""
    scaled = pool(scaleDownStabilizationSeconds=3600)
    history: list[autoscaling.Sample] = []
    current = 16
    seen = []
    for step, active in enumerate(demand):
        sample = autoscaling.Sample(float(step), autoscaling.recommend(active, scaled))
        history = autoscaling.remember(history, sample, scaled)
        current = autoscaling.decide(history, float(step), current, scaled)
        seen.append(current)
    assert seen == sorted(seen)


def run(scaled: pools.Pool, demand: int | autoscaling.Demand, current: int,
        at: float, state: autoscaling.State | None = None,
        ) -> tuple[autoscaling.State, autoscaling.Decision]:
    wanted = demand if isinstance(demand, autoscaling.Demand) else autoscaling.Demand(demand)
    return autoscaling.step(state or autoscaling.seeded(at, current), wanted, at, current, scaled)


def test_a_fresh_operator_never_scales_down_before_a_whole_window() -> None:
    """Seeded from spec.slots: a restart with no streams keeps 64 slots for 300 s."""
    scaled = pool(scaleDownStabilizationSeconds=300)
    state, decision = run(scaled, 0, 64, at=1000.0)
    assert (decision.slots, decision.limited_by) == (64, autoscaling.SCALE_DOWN_STABILIZATION)
    assert decision.recommended == 8
    state, decision = run(scaled, 0, 64, 1299.0, state)
    assert decision.slots == 64
    state, decision = run(scaled, 0, 64, 1301.0, state)
    assert (decision.slots, decision.limited_by) == (8, autoscaling.MIN_SLOTS)


def test_waiting_and_refused_clients_are_demand() -> None:
    scaled = pool(maxSlots=1000)
    _, decision = run(scaled, autoscaling.Demand(active=8, waiting=10, refused=6), 8, 0.0)
    assert decision.recommended == 32  # 24 / 0.75
    assert decision.slots == 32


def test_a_pool_at_zero_wakes_up_when_a_client_waits() -> None:
    """minSlots 0 lets it sleep; one waiting client brings one pod, even when the only
    policy is a percentage (a percentage of zero is zero)."""
    asleep = pool(minSlots=0, behavior={"scaleUp": {"policies": [
        {"type": "Percent", "value": 100, "periodSeconds": 60}]}})
    _, decision = run(asleep, 0, 0, 0.0)
    assert decision.slots == 0
    _, decision = run(asleep, autoscaling.Demand(active=0, waiting=1), 0, 0.0)
    assert decision.slots == 8
    _, decision = run(asleep, autoscaling.Demand(active=0, refused=30), 0, 0.0)
    assert (decision.slots, decision.limited_by) == (8, autoscaling.SCALE_UP_POLICY)


def test_min_slots_defaults_to_one_pod() -> None:
    unset = pools.from_body({"metadata": {"name": "p"}, "spec": {
        "model": {"name": "tiny"}, "slots": 16, "slotsPerPod": 4,
        "autoscaling": {"enabled": True, "maxSlots": 64}}})
    assert unset.autoscaling.min_slots == 4
    assert autoscaling.recommend(0, unset) == 4


def test_scale_up_follows_the_hpa_default_policies() -> None:
    """Up by 4 pods or 100% per 15 s, whichever is more: 1 pod -> 5 -> 10 pods."""
    scaled = pool(maxSlots=1000)
    state, decision = run(scaled, 400, 8, 0.0)
    assert (decision.slots, decision.limited_by) == (40, autoscaling.SCALE_UP_POLICY)
    state, decision = run(scaled, 400, 40, 10.0, state)
    assert decision.slots == 40  # the period that began at 8 slots is not over
    state, decision = run(scaled, 400, 40, 15.0, state)
    assert decision.slots == 80  # 100% of 40 beats 4 pods (32 slots)


def test_select_min_takes_the_smaller_policy() -> None:
    scaled = pool(maxSlots=1000, behavior={"scaleUp": {"selectPolicy": "Min"}})
    _, decision = run(scaled, 400, 64, 0.0)
    assert decision.slots == 96  # 4 pods (32 slots) is less than 100% (64)


def test_scale_down_by_one_pod_a_minute() -> None:
    scaled = pool(scaleDownStabilizationSeconds=0, behavior={"scaleDown": {"policies": [
        {"type": "Pods", "value": 1, "periodSeconds": 60}]}})
    state, decision = run(scaled, 0, 32, 0.0)
    assert (decision.slots, decision.limited_by) == (24, autoscaling.SCALE_DOWN_POLICY)
    state, decision = run(scaled, 0, 24, 30.0, state)
    assert decision.slots == 24
    state, decision = run(scaled, 0, 24, 60.0, state)
    assert decision.slots == 16


def test_a_disabled_direction_never_moves() -> None:
    scaled = pool(scaleDownStabilizationSeconds=0,
                  behavior={"scaleDown": {"selectPolicy": "Disabled"}})
    _, decision = run(scaled, 0, 32, 0.0)
    assert (decision.slots, decision.limited_by) == (32, autoscaling.SCALE_DOWN_POLICY)


def test_the_bounds_win_over_the_policies() -> None:
    """A manual value out of bounds comes back at once, as the HPA's does."""
    scaled = pool(behavior={"scaleDown": {"policies": [
        {"type": "Pods", "value": 1, "periodSeconds": 600}]}})
    _, decision = run(scaled, 1000, 4096, 0.0)
    assert decision.slots == 128
    _, decision = run(scaled, 1000, 128, 0.0)
    assert (decision.slots, decision.limited_by) == (128, autoscaling.MAX_SLOTS)


@given(st.lists(st.integers(0, 2000), min_size=1, max_size=30), st.integers(1, 20))
def test_slots_stay_whole_pods_within_bounds(demand: list[int], start_pods: int) -> None:
    scaled = pool(maxSlots=512, scaleDownStabilizationSeconds=20)
    current, state = start_pods * 8, None
    for step, wanted in enumerate(demand):
        state, decision = run(scaled, wanted, current, step * 5.0, state)
        if 8 <= current <= 512:
            assert 8 <= decision.slots <= 512 and decision.slots % 8 == 0
        current = decision.slots
