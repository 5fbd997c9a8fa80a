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
