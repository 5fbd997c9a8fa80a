"""The discrete-event simulation of one pool: arrivals, the waiting room, pods that
start, serve and drain, and the operator's autoscaler on a simulated clock.

One heap holds every timed event (stream ends, pods ready, drain deadlines, autoscaler
passes, timeline samples); arrivals come from the scenario's sorted chunks and are
merged in. Nothing loops over streams or over simulated seconds: the cost is a few
microseconds per session.

What the simulation takes as the real system does:

- Admission: the router's waiting room is first come, first served
  (:func:`policies.queue_may_admit`); a waiter is admitted as soon as a slot frees
  (the router polls every 0.1 s, so real waits are up to that much longer) or refused
  at its ``queue_timeout_seconds``; with no timeout a busy pool refuses at once.
- Placement: :func:`policies.choose_pod` (see :mod:`asrpool.plan.fleets`).
- Scaling: every ``resync_seconds`` the operator's :func:`autoscaling.recommend`,
  :func:`autoscaling.remember` and :func:`autoscaling.decide` set the slots from the
  active streams; the Deployment then has ``pods_for(slots)`` replicas. New pods take
  ``startup_seconds`` (scheduling, image, model load) before they take streams.
- Scale-down follows the ReplicaSet's order with the operator's pod-deletion-cost
  (live streams): pods still starting go first, then ready pods with the fewest
  streams, newest first. An idle pod goes at once; a busy one drains (no new
  streams) until its last stream ends or ``drain_grace_seconds`` pass, when the
  server closes what is left: those streams count as cut.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
from collections.abc import Iterable

from asrpool.operator import autoscaling, pools
from asrpool.plan import fleets, scenarios
from asrpool.router import policies

END, READY, DRAIN_DEADLINE, SCALE, SAMPLE = range(5)  # same-time order: ends first


@dataclasses.dataclass(frozen=True)
class Plan:
    """A pool and its router and operator settings, as the simulation runs them."""

    pool: pools.Pool  # the operator's value: slots, slotsPerPod, autoscaling, drain grace
    policy: policies.Policy = "pack"
    queue_timeout_seconds: float = 0.0
    startup_seconds: float = 120.0
    resync_seconds: float = 15.0
    gpus_per_pod: int = 1
    sample_seconds: float = 60.0


@dataclasses.dataclass
class Counts:
    arrivals: int = 0
    admitted: int = 0
    queued: int = 0  # waited at all, admitted later or not
    refused: int = 0  # at once or at the queue timeout
    waiting_at_end: int = 0  # generated traffic stops at the horizon, waiters too
    cut: int = 0
    audio_seconds: float = 0.0
    pod_seconds: float = 0.0
    peak_pods: int = 0
    peak_streams: int = 0
    waits: list[float] = dataclasses.field(default_factory=list)  # of queued admissions


@dataclasses.dataclass
class Timeline:
    """One row per sample: the interval's arrivals, then the state at its end."""

    at: list[float] = dataclasses.field(default_factory=list)
    arrivals: list[int] = dataclasses.field(default_factory=list)
    active: list[int] = dataclasses.field(default_factory=list)
    slots: list[int] = dataclasses.field(default_factory=list)  # of serving pods
    pods: list[int] = dataclasses.field(default_factory=list)  # live, any state
    waiting: list[int] = dataclasses.field(default_factory=list)
    refused: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Outcome:
    plan: Plan
    horizon: float
    counts: Counts
    timeline: Timeline
    carried: int = 0


class Simulation:
    def __init__(self, plan: Plan) -> None:
        self.plan, self.pool = plan, plan.pool
        self.fleet = fleets.Fleet(plan.pool.slots_per_pod, plan.policy)
        self.counts, self.timeline = Counts(), Timeline()
        self.events: list[tuple[float, int, int]] = []
        self.waiting: collections.deque[tuple[float, float, float]] = collections.deque()
        self.slots = plan.pool.slots
        self.history: list[autoscaling.Sample] = []
        self.now = 0.0
        self._sampled_arrivals = self._sampled_refusals = 0
        self.carried = 0

    def run(self, carried: Iterable[float], chunks: Iterable[scenarios.Chunk],
            horizon: float | None) -> Outcome:
        """Simulate until ``horizon`` (None: until the last stream of the trace ends).

        ``carried`` are the durations left of streams already open at the start: they
        arrive first (counted as arrivals, not in the timeline's first interval).
        """
        self._start()
        for duration in carried:
            self._arrive(duration)
        self.carried = self._sampled_arrivals = self.counts.arrivals
        end = math.inf if horizon is None else horizon
        for starts, durations in chunks:
            if not self._replay(starts, durations, end):
                break
        self._until(end if horizon is not None else self._drained_at())
        return self._finish()

    def _replay(self, starts: list[float], durations: list[float], end: float) -> bool:
        """One chunk of arrivals and the events due among them; False once past ``end``.

        The hot loop of the simulation: :meth:`_until` and the common case of
        :meth:`_arrive` written out, because a call costs as much as the work here.
        """
        events, pods, waiting, fleet = self.events, self.fleet.pods, self.waiting, self.fleet
        counts, pop, push = self.counts, heapq.heappop, heapq.heappush
        for start, duration in zip(starts, durations, strict=True):
            if start >= end:
                return False
            while events and events[0][0] <= start:
                at, kind, index = pop(events)
                if kind != END:
                    self.now = at
                    self._control(kind, index)
                elif waiting or (pod := pods[index]).state != fleets.READY:
                    self.now = at
                    self._end(pods[index], at)
                else:
                    fleet.depart(pod, at)
            self.now = start
            if waiting:
                self._expire(start)
                self._arrive(duration)
            elif fleet.free:
                chosen = fleet.choose()
                assert chosen is not None
                fleet.place(chosen, start + duration)
                push(events, (start + duration, END, chosen.index))
                counts.arrivals += 1
                counts.admitted += 1
                counts.audio_seconds += duration
                if fleet.active > counts.peak_streams:
                    counts.peak_streams = fleet.active
            else:
                self._arrive(duration)
        return True

    def _start(self) -> None:
        for _ in range(self.pool.pods):
            self.fleet.serve(self._new_pod())
        self._push(self.plan.resync_seconds, SCALE)  # the operator's first timer pass
        self._push(self.plan.sample_seconds, SAMPLE)

    def _until(self, t: float) -> None:
        """Handle every event due up to and including ``t``; the clock ends at ``t``."""
        events, fleet = self.events, self.fleet
        while events and events[0][0] <= t:
            at, kind, index = heapq.heappop(events)
            self.now = at
            if kind == END:
                self._end(fleet.pods[index], at)
            else:
                self._control(kind, index)
        self.now = t
        if self.waiting and self.waiting[0][0] < t:
            self._expire(t)

    def _drained_at(self) -> float:
        """The time the last stream of a trace ends (waiters included)."""
        while self.fleet.active or self.waiting:
            self._until(self.events[0][0])
        return self.now

    def _arrive(self, duration: float) -> None:
        counts = self.counts
        counts.arrivals += 1
        if policies.queue_may_admit(len(self.waiting), self.fleet.free):
            self._admit(duration)
        elif self.plan.queue_timeout_seconds > 0:
            counts.queued += 1
            self.waiting.append((self.now + self.plan.queue_timeout_seconds, self.now, duration))
        else:
            counts.refused += 1

    def _admit(self, duration: float) -> None:
        pod = self.fleet.choose()
        assert pod is not None, "admitted with no free slot"
        end = self.now + duration
        self.fleet.place(pod, end)
        heapq.heappush(self.events, (end, END, pod.index))
        self.counts.admitted += 1
        self.counts.audio_seconds += duration
        if self.fleet.active > self.counts.peak_streams:
            self.counts.peak_streams = self.fleet.active

    def _end(self, pod: fleets.Pod, at: float) -> None:
        if pod.state == fleets.GONE:
            return  # cut when its pod went
        self.fleet.depart(pod, at)
        if pod.state == fleets.DRAINING and not pod.used:
            self._gone(pod)
        elif self.waiting:
            self._admit_waiters()

    def _admit_waiters(self) -> None:
        self._expire(self.now)
        while self.waiting and policies.queue_may_admit(0, self.fleet.free):
            _, arrived, duration = self.waiting.popleft()
            self.counts.waits.append(self.now - arrived)
            self._admit(duration)

    def _expire(self, now: float) -> None:
        while self.waiting and self.waiting[0][0] < now:
            self.waiting.popleft()
            self.counts.refused += 1

    def _control(self, kind: int, index: int) -> None:
        if kind == READY:
            pod = self.fleet.pods[index]
            if pod.state == fleets.STARTING:
                self.fleet.serve(pod)
                self._admit_waiters()
        elif kind == DRAIN_DEADLINE:
            pod = self.fleet.pods[index]
            if pod.state == fleets.DRAINING:
                self._gone(pod)
        elif kind == SCALE:
            self._autoscale()
            self._push(self.now + self.plan.resync_seconds, SCALE)
        else:
            self._sample()
            self._push(self.now + self.plan.sample_seconds, SAMPLE)

    def _push(self, at: float, kind: int, index: int = -1) -> None:
        heapq.heappush(self.events, (at, kind, index))

    def _autoscale(self) -> None:
        """One operator pass: the real autoscaler's functions, then the Deployment."""
        if not self.pool.autoscaling.enabled:
            return
        now, pool = self.now, self.pool
        sample = autoscaling.Sample(now, autoscaling.recommend(self.fleet.active, pool))
        self.history = autoscaling.remember(self.history, sample, pool)
        self.slots = autoscaling.decide(self.history, now, self.slots, pool)
        self._scale_to(pools.pods_for(self.slots, pool.slots_per_pod))

    def _scale_to(self, replicas: int) -> None:
        for _ in range(replicas - self.fleet.replicas):
            self._push(self.now + self.plan.startup_seconds, READY, self._new_pod().index)
        surplus = self.fleet.replicas - replicas
        if surplus > 0:
            current = [p for p in self.fleet.alive.values() if p.state != fleets.DRAINING]
            for pod in heapq.nsmallest(surplus, current, key=_deletion_order):
                self._scale_down(pod)

    def _scale_down(self, pod: fleets.Pod) -> None:
        if not pod.used:
            self._gone(pod)
            return
        self.fleet.drain(pod)
        grace = float(self.pool.drain_grace_seconds)
        self._push(self.now + grace, DRAIN_DEADLINE, pod.index)

    def _new_pod(self) -> fleets.Pod:
        pod = self.fleet.add(self.now)
        self.counts.peak_pods = max(self.counts.peak_pods, len(self.fleet.alive))
        return pod

    def _gone(self, pod: fleets.Pod) -> None:
        """The pod leaves the pool now: its GPU time ends, its last streams are cut."""
        if pod.used:
            self.counts.cut += pod.used
            self.counts.audio_seconds -= pod.depart_sum - pod.used * self.now
        self.counts.pod_seconds += self.now - pod.created
        self.fleet.remove(pod)

    def _sample(self) -> None:
        line, counts, fleet = self.timeline, self.counts, self.fleet
        line.at.append(self.now)
        line.arrivals.append(counts.arrivals - self._sampled_arrivals)
        line.refused.append(counts.refused - self._sampled_refusals)
        self._sampled_arrivals, self._sampled_refusals = counts.arrivals, counts.refused
        line.active.append(fleet.active)
        line.slots.append(fleet.serving * fleet.slots)
        line.pods.append(len(fleet.alive))
        line.waiting.append(len(self.waiting))

    def _finish(self) -> Outcome:
        """Close the books at the horizon: streams still open count up to now only."""
        counts = self.counts
        counts.waiting_at_end = len(self.waiting)
        for pod in self.fleet.alive.values():
            counts.audio_seconds -= pod.depart_sum - pod.used * self.now
            counts.pod_seconds += self.now - pod.created
        return Outcome(self.plan, self.now, counts, self.timeline, self.carried)


def _deletion_order(pod: fleets.Pod) -> tuple[int, int, int]:
    """The ReplicaSet's: not ready first, then the lowest deletion cost, newest first."""
    return (pod.state != fleets.STARTING, pod.used, -pod.index)
