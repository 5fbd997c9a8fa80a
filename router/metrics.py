"""Prometheus metrics of one router, in a registry of their own (no global state).

A router of several worker processes (``--workers``) answers ``/metrics`` from whichever
worker the kernel gave the scrape: each worker then keeps its values in files of one
shared folder (prometheus_client's multiprocess mode; :mod:`sharedmetrics` makes the
folder before prometheus_client is imported), and every worker's exposition sums them.
Gauges say how they combine: streams open add up over the live workers; pool gauges
and prices, the same in every worker, are the most recent value.
"""

from __future__ import annotations

import math
import os

import prometheus_client
from prometheus_client import multiprocess

from asrpool.router import sharedmetrics

# Per API key: at most this many keys by id, the rest together (a key file of thousands of
# keys must not make thousands of series); streams without keys are "anonymous".
MAX_KEY_LABELS = 200
OTHER_KEYS, ANONYMOUS = "other", "anonymous"


class Metrics:
    def __init__(self) -> None:
        self.shared_dir = os.environ.get(sharedmetrics.ENV)
        self.registry = prometheus_client.CollectorRegistry()
        r = self.registry
        self.sessions_open = prometheus_client.Gauge(
            "asrpool_router_sessions_open", "Streams this router is proxying now", registry=r,
            multiprocess_mode="livesum",
        )
        self.admissions = prometheus_client.Counter(
            "asrpool_router_admissions", "Streams admitted", ["pool", "kind"], registry=r
        )
        self.rejections = prometheus_client.Counter(
            "asrpool_router_rejections", "Streams refused, by reason", ["reason"], registry=r
        )
        self.moves = prometheus_client.Counter(
            "asrpool_router_streams_moved",
            "Streams whose pod was lost: moved to another pod, or failed to (ended pod_lost)",
            ["outcome"], registry=r,
        )
        self.free_slots = prometheus_client.Gauge(
            "asrpool_router_free_slots",
            "Free slots per pool, as admission counts them",
            ["pool"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.malformed_heartbeats = prometheus_client.Gauge(
            "asrpool_router_malformed_heartbeats",
            "Pod records in the pool's registry that are no heartbeat (a forged or broken "
            "field): skipped, no pod to admission (/api/pools names them)",
            ["pool"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.unread_pods = prometheus_client.Gauge(
            "asrpool_router_unread_pods",
            "Entries of the pool's lease set past the most a router reads per pass (4,096, "
            "the latest leases): a pool flooded by whoever writes it",
            ["pool"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.admission_seconds = prometheus_client.Histogram(
            "asrpool_router_admission_seconds",
            "Time from upgrade to the pod's Ready",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
        )
        self.relayed = prometheus_client.Counter(
            "asrpool_router_relayed_messages",
            "Websocket messages relayed (up: client to pod), counted every ping period",
            ["direction"],
            registry=r,
        )
        self.redis_errors = prometheus_client.Counter(
            "asrpool_router_redis_errors", "Redis calls that failed", ["op"], registry=r
        )
        # What each API key used: to bill or limit by (keys past MAX_KEY_LABELS: other).
        self.key_streams = prometheus_client.Counter(
            "asrpool_router_key_streams", "Streams admitted (new, not resumed), per API key",
            ["key"], registry=r,
        )
        self.key_audio_seconds = prometheus_client.Counter(
            "asrpool_router_key_audio_seconds",
            "Seconds of audio clients sent (Kyutai's PCM streams; a realtime session's "
            "transcribed turns), per API key, counted at each connection's end", ["key"],
            registry=r,
        )
        self._key_labels: set[str] = set()
        # The configured prices, so that dashboards compute cost from one setting.
        self.gpu_hour_price = prometheus_client.Gauge(
            "asrpool_router_gpu_hour_price_dollars",
            "Configured price of one GPU-hour (NaN: not configured)",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.gpus_per_pod = prometheus_client.Gauge(
            "asrpool_router_gpus_per_pod", "Configured GPUs of one server pod", registry=r,
            multiprocess_mode="mostrecent",
        )
        self.gpu_hour_price.set(math.nan)
        self.gpus_per_pod.set(1)

    def key_label(self, key_id: str) -> str:
        """The ``key`` label of an API key: its id, while fewer than MAX_KEY_LABELS have
        been seen by this process; ``other`` after."""
        if not key_id:
            return ANONYMOUS
        if key_id in self._key_labels or len(self._key_labels) < MAX_KEY_LABELS:
            self._key_labels.add(key_id)
            return key_id
        return OTHER_KEYS

    def publish_pricing(self, gpu_hour_price: float | None, gpus_per_pod: float) -> None:
        self.gpu_hour_price.set(math.nan if gpu_hour_price is None else gpu_hour_price)
        self.gpus_per_pod.set(gpus_per_pod)

    def exposition(self) -> bytes:
        """This router's metrics: of this process, or summed over every worker's files."""
        if self.shared_dir is None:
            return prometheus_client.generate_latest(self.registry)
        merged = prometheus_client.CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, path=self.shared_dir)
        return prometheus_client.generate_latest(merged)


def forget_worker(pid: int) -> None:
    """A worker exited: its live gauges (streams open) stop counting; its counters stay
    in the sums, which therefore never go down."""
    shared_dir = os.environ.get(sharedmetrics.ENV)
    if shared_dir is not None:
        multiprocess.mark_process_dead(pid, shared_dir)
