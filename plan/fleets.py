"""The simulated pods of one pool, grouped by free slots for fast placement.

Placement calls the router's own :func:`asrpool.router.policies.choose_pod`. Its
choice depends on each pod's free slots and, among equals, the smallest pod id, so
the fleet keeps, for every free-slot level, a heap of the serving pods at that level
and hands the policy one pod per level: the lowest id of the fullest and of the
emptiest level. A policy that orders pods by free slots (``pack``, ``spread``) picks
among those two exactly what it would pick among all pods; ``tests/plan`` checks that
on random fleets for every policy in :data:`policies.POLICIES`. With one level there
is nothing to choose: its lowest id is every such policy's pick. For the same reason
the answer depends only on the two levels and at most on which of the two pods has the
lower id, so the policy is asked once per pair of levels (with the ids both ways, on
two stand-in loads) and the answer is remembered: the call costs microseconds, the
look-up a tenth of that, and a day has millions of placements; and only the chosen
level's heap is looked at.
"""

from __future__ import annotations

import heapq

from asrpool.router import policies

STARTING, READY, DRAINING, GONE = "starting", "ready", "draining", "gone"


class Pod:
    """One server pod; ``depart_sum`` adds up its streams' end times (for cut audio)."""

    __slots__ = ("created", "depart_sum", "index", "name", "state", "used")

    def __init__(self, index: int, created: float) -> None:
        self.index, self.created = index, created
        self.name = f"pod-{index:07d}"  # zero-padded: name order is creation order
        self.state = STARTING
        self.used = 0
        self.depart_sum = 0.0

    def load(self, slots: int) -> policies.PodLoad:
        """The pod as the router's policy sees it."""
        return policies.PodLoad(self.name, self.name, slots, self.used)


class Fleet:
    """Pods of one pool and the free slots of the serving ones (ready, not draining)."""

    def __init__(self, slots_per_pod: int, policy: policies.Policy) -> None:
        self.slots, self.policy = slots_per_pod, policy
        self.pods: list[Pod] = []  # every pod ever, by index
        self.alive: dict[int, Pod] = {}  # pods not gone (starting, ready, draining)
        self.replicas = 0  # starting or ready: the Deployment's pods
        self.serving = 0  # ready pods
        self.active = 0  # streams on every live pod
        self.free = 0  # free slots of serving pods
        self._heaps: list[list[int]] = [[] for _ in range(slots_per_pod + 1)]
        self._counts = [0] * (slots_per_pod + 1)
        self._lo = self._hi = 0  # fullest and emptiest level with a pod (0: none)
        self._choices: dict[tuple[int, ...], str] = {}  # the policy's answers, remembered

    def add(self, now: float) -> Pod:
        pod = Pod(len(self.pods), now)
        self.pods.append(pod)
        self.alive[pod.index] = pod
        self.replicas += 1
        return pod

    def serve(self, pod: Pod) -> None:
        """A started pod takes streams from now on."""
        pod.state = READY
        self.serving += 1
        self._enter(pod, self.slots - pod.used)

    def choose(self) -> Pod | None:
        """The pod the router's policy places the next stream on, or None (no room)."""
        if not self.free:
            return None
        lo, hi = self._lo, self._hi
        if lo == hi:
            return self._top(lo)
        answer = self._choices.get((lo, hi))
        if answer is None:
            answer = self._ask(lo, hi)
        if answer == "ids":  # the policy looks at which id is lower: compare them
            fullest, emptiest = self._top(lo), self._top(hi)
            answer = self._ask(lo, hi, fullest.index < emptiest.index)
            return fullest if answer == "fullest" else emptiest
        return self._top(lo if answer == "fullest" else hi)

    def _ask(self, lo: int, hi: int, fullest_first: bool | None = None) -> str:
        """The policy's pick between a pod with ``lo`` and one with ``hi`` free slots:
        "fullest", "emptiest", or "ids" when it depends on which has the lower id."""
        key = (lo, hi) if fullest_first is None else (lo, hi, fullest_first)
        if key in self._choices:
            return self._choices[key]
        orders = [True, False] if fullest_first is None else [fullest_first]
        picks = {self._pick(lo, hi, first) for first in orders}
        self._choices[key] = answer = picks.pop() if len(picks) == 1 else "ids"
        return answer

    def _pick(self, lo: int, hi: int, fullest_first: bool) -> str:
        names = ("pod-a", "pod-b") if fullest_first else ("pod-b", "pod-a")
        fullest = policies.PodLoad(names[0], names[0], self.slots, self.slots - lo)
        emptiest = policies.PodLoad(names[1], names[1], self.slots, self.slots - hi)
        chosen = policies.choose_pod([fullest, emptiest], self.policy)
        return "fullest" if chosen is fullest else "emptiest"

    def place(self, pod: Pod, end: float) -> None:
        """A stream that ends at ``end`` starts on the serving ``pod``."""
        pod.used += 1
        pod.depart_sum += end
        self.active += 1
        self._move(pod, self.slots - pod.used + 1, -1)

    def depart(self, pod: Pod, end: float) -> None:
        pod.used -= 1
        pod.depart_sum -= end
        self.active -= 1
        if pod.state == READY:
            self._move(pod, self.slots - pod.used - 1, 1)

    def drain(self, pod: Pod) -> None:
        """No new streams on ``pod``; its streams go on."""
        self._stop_serving(pod)
        pod.state = DRAINING

    def remove(self, pod: Pod) -> None:
        """The pod is gone; whatever streams it still held are cut."""
        self._stop_serving(pod)
        self.active -= pod.used
        pod.state, pod.used, pod.depart_sum = GONE, 0, 0.0
        del self.alive[pod.index]

    def _stop_serving(self, pod: Pod) -> None:
        if pod.state == READY:
            self._leave(pod, self.slots - pod.used)
            self.serving -= 1
        if pod.state in (READY, STARTING):
            self.replicas -= 1

    def _move(self, pod: Pod, level: int, step: int) -> None:
        """A serving pod's free slots go from ``level`` to ``level + step``."""
        self.free += step
        counts, to = self._counts, level + step
        if level:
            counts[level] -= 1
        if to:
            counts[to] += 1
            heap = self._heaps[to]
            heapq.heappush(heap, pod.index)
            if len(heap) > 2 * counts[to] + 64:
                self._compact(to)
        if to and counts[to] == 1:
            self._rebound(to)
        if level and not counts[level]:
            self._rebound(0)

    def _enter(self, pod: Pod, level: int) -> None:
        self.free += level
        if level == 0:
            return
        self._counts[level] += 1
        heap = self._heaps[level]
        heapq.heappush(heap, pod.index)
        if len(heap) > 2 * self._counts[level] + 64:
            self._compact(level)
        if self._counts[level] == 1:
            self._rebound(level)

    def _leave(self, pod: Pod, level: int) -> None:
        self.free -= level
        if level == 0:
            return
        self._counts[level] -= 1
        if self._counts[level] == 0:
            self._rebound(0)

    def _rebound(self, entered: int) -> None:
        """Fix the fullest and emptiest filled levels after one filled or emptied."""
        lo, hi = self._lo, self._hi
        if entered:
            self._lo, self._hi = (min(lo, entered) if lo else entered), max(hi, entered)
            return
        counts = self._counts
        while lo and not counts[lo]:
            lo = lo + 1 if lo < hi else 0
        while hi and not counts[hi]:
            hi = hi - 1 if hi > lo else 0
        self._lo, self._hi = (lo, hi) if lo and hi else (0, 0)

    def _top(self, level: int) -> Pod:
        """The lowest-id serving pod with ``level`` free slots (stale entries dropped)."""
        heap = self._heaps[level]
        while True:
            pod = self.pods[heap[0]]
            if pod.state == READY and self.slots - pod.used == level:
                return pod
            heapq.heappop(heap)

    def _compact(self, level: int) -> None:
        heap = self._heaps[level]
        valid = {i for i in heap if self.pods[i].state == READY
                 and self.slots - self.pods[i].used == level}
        heap[:] = sorted(valid)
