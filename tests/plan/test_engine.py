"""The event engine: admission, the waiting room, placement by the router's policy,
scaling by the operator's autoscaler, draining, and the books it keeps."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asrpool.operator import autoscaling
from asrpool.plan import fleets, reports, scenarios, simulating
from asrpool.router import policies
from tests.plan.support import pool, replay


def test_a_full_pool_refuses_at_once_without_a_queue() -> None:
    plan = simulating.Plan(pool(slots_per_pod=2, pods=1))
    out = replay(plan, [(0.0, 10.0), (1.0, 10.0), (2.0, 10.0), (11.0, 1.0)])
    c = out.counts
    assert (c.arrivals, c.admitted, c.queued, c.refused) == (4, 3, 0, 1)
    assert out.horizon == 12.0  # a trace runs until its last stream ends
    assert c.audio_seconds == pytest.approx(21.0)


def test_the_waiting_room_admits_first_come_first_served_or_refuses_at_the_timeout() -> None:
    plan = simulating.Plan(pool(slots_per_pod=1, pods=1), queue_timeout_seconds=3.0)
    # 0-5 holds the slot; the arrival at 1 waits 4 s (too long), the one at 3 waits 2 s.
    out = replay(plan, [(0.0, 5.0), (1.0, 1.0), (3.0, 1.0)])
    c = out.counts
    assert (c.admitted, c.queued, c.refused) == (2, 2, 1)
    assert c.waits == [pytest.approx(2.0)]
    assert reports.waits(c)["p99"] == pytest.approx(2.0)
    assert reports.waits(c)["p50"] == 0.0


@pytest.mark.parametrize(("policy", "expected"), [("pack", [2, 0]), ("spread", [1, 1])])
def test_placement_follows_the_routers_policy(policy: policies.Policy,
                                              expected: list[int]) -> None:
    sim = simulating.Simulation(simulating.Plan(pool(slots_per_pod=2, pods=2), policy=policy))
    sim.run([], [([0.0, 0.5], [100.0, 100.0])], horizon=1.0)
    assert [pod.used for pod in sim.fleet.pods] == expected


def _random_fleet(rng: random.Random, policy: policies.Policy) -> fleets.Fleet:
    fleet = fleets.Fleet(slots_per_pod=rng.randint(1, 6), policy=policy)
    for _ in range(rng.randint(1, 12)):
        pod = fleet.add(0.0)
        if rng.random() < 0.8:
            fleet.serve(pod)
            for _ in range(rng.randint(0, fleet.slots)):
                fleet.place(pod, 1.0)
            if rng.random() < 0.2:
                fleet.drain(pod)
    return fleet


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32), policy=st.sampled_from(policies.POLICIES),
       churn=st.integers(0, 30))
def test_the_fleets_choice_is_the_policys_choice_among_all_pods(
        seed: int, policy: policies.Policy, churn: int) -> None:
    """Two representatives (fullest and emptiest level) give the full snapshot's answer."""
    rng = random.Random(seed)
    fleet = _random_fleet(rng, policy)
    for _ in range(churn):
        serving = [p for p in fleet.pods if p.state == fleets.READY]
        busy = [p for p in serving if p.used]
        if busy and rng.random() < 0.5:
            fleet.depart(rng.choice(busy), 1.0)
        elif (chosen := fleet.choose()) is not None:
            fleet.place(chosen, 1.0)
    snapshot = [dataclasses.replace(p.load(fleet.slots), draining=p.state == fleets.DRAINING)
                for p in fleet.pods if p.state in (fleets.READY, fleets.DRAINING)]
    want = policies.choose_pod(snapshot, policy)
    got = fleet.choose()
    assert (got.name if got else None) == (want.pod_id if want else None)
    assert fleet.free == policies.free_slots(snapshot)


def test_a_seed_gives_the_same_day_and_another_seed_another() -> None:
    def day(seed: int) -> dict[str, Any]:
        traffic = scenarios.Traffic(peak_rate=2.0, mean_duration=120.0, duration_sigma=1.0,
                                    hours=3.0, seed=seed)
        plan = simulating.Plan(pool(slots_per_pod=4, pods=2, minSlots=4), queue_timeout_seconds=2.0,
                               startup_seconds=60.0)
        out = simulating.Simulation(plan).run(*traffic.sessions(), traffic.horizon)
        return reports.summary(out, price=1.0)

    assert day(7) == day(7)
    assert day(7)["arrivals"] != day(8)["arrivals"]


def test_every_arrival_is_admitted_refused_or_still_waiting() -> None:
    traffic = scenarios.Traffic(peak_rate=3.0, mean_duration=60.0, duration_sigma=1.5,
                                hours=2.0, seed=1)
    plan = simulating.Plan(pool(slots_per_pod=4, pods=1, minSlots=4, maxSlots=40),
                           queue_timeout_seconds=5.0, startup_seconds=90.0)
    c = simulating.Simulation(plan).run(*traffic.sessions(), traffic.horizon).counts
    assert c.refused and c.queued and c.admitted  # maxSlots is too low for the peak
    assert c.arrivals == c.admitted + c.refused + c.waiting_at_end


def test_the_operators_autoscaler_sets_the_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulation calls the operator's own functions, once per operator pass."""
    calls: list[tuple[float, int]] = []
    decide = autoscaling.decide

    def spy(history: Any, now: float, current: int, pool: Any) -> int:
        calls.append((now, current))
        return decide(history, now, current, pool)

    monkeypatch.setattr(autoscaling, "decide", spy)
    plan = simulating.Plan(pool(slots_per_pod=2, pods=1, minSlots=2), resync_seconds=10.0,
                           startup_seconds=5.0)
    out = replay(plan, [(float(t), 100.0) for t in range(6)], horizon=60.0)
    assert [now for now, _ in calls] == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    # 2 streams fit at once, 4 are refused; 2 active with 25% free is 4 slots: 2 pods.
    assert out.counts.admitted == 2 and out.counts.peak_pods == 2
    assert calls[1] == (20.0, 4)


def test_scale_down_drains_busy_pods_and_cuts_only_past_the_grace() -> None:
    def run(policy: policies.Policy, grace: int) -> simulating.Counts:
        plan = simulating.Plan(
            pool(slots_per_pod=2, pods=4, drain_grace=grace, minSlots=2,
                 scaleDownStabilizationSeconds=0),
            policy=policy, resync_seconds=10.0)
        # Four long streams spread over four pods with spread; a 2-slot need after.
        return replay(plan, [(0.0, 25.0), (0.1, 25.0), (0.2, 200.0), (0.3, 5.0)]).counts

    spread_short, spread_long = run("spread", grace=10), run("spread", grace=600)
    assert spread_short.cut > 0 and spread_long.cut == 0
    assert run("pack", grace=10).cut == 0  # pack leaves idle pods to remove first
    assert spread_short.pod_seconds < spread_long.pod_seconds


def test_pods_take_streams_only_once_started() -> None:
    plan = simulating.Plan(pool(slots_per_pod=1, pods=1, minSlots=1), queue_timeout_seconds=60.0,
                           resync_seconds=1.0, startup_seconds=30.0)
    out = replay(plan, [(0.0, 100.0), (0.5, 10.0)])
    # The second stream waits for the pod started at the first pass (t=1) to load.
    assert out.counts.waits == [pytest.approx(30.5)]


def test_streams_open_at_the_start_are_carried_not_counted_in_the_first_interval() -> None:
    traffic = scenarios.Traffic(peak_rate=1.0, mean_duration=600.0, duration_sigma=0.5,
                                hours=1.0, trough=1.0, seed=3)
    plan = simulating.Plan(pool(slots_per_pod=8, pods=100))
    out = simulating.Simulation(plan).run(*traffic.sessions(), traffic.horizon)
    assert 450 < out.carried < 750  # about rate x mean duration
    assert out.timeline.arrivals[0] < 120
    assert out.counts.arrivals == out.carried + sum(out.timeline.arrivals)


def test_a_policy_that_looks_at_ids_is_asked_with_the_real_ids(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy outside the two levels' shortcut (lowest id wins) still gets its way."""
    def lowest_id(pods: Any, policy: Any, exclude: Any = ()) -> policies.PodLoad | None:
        return min(policies.eligible(pods, exclude), key=lambda p: p.pod_id, default=None)

    monkeypatch.setattr(policies, "choose_pod", lowest_id)
    fleet = fleets.Fleet(slots_per_pod=4, policy="pack")
    older, newer = fleet.add(0.0), fleet.add(0.0)
    for pod in (older, newer):
        fleet.serve(pod)
    fleet.place(newer, 1.0)  # newer is now the fullest
    assert fleet.choose() is older
    fleet.place(older, 1.0)
    fleet.place(older, 1.0)  # older is now the fullest
    assert fleet.choose() is older
