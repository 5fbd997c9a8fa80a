"""Prometheus metrics of one router, in a registry of their own (no global state)."""

from __future__ import annotations

import math

import prometheus_client


class Metrics:
    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        r = self.registry
        self.sessions_open = prometheus_client.Gauge(
            "asrpool_router_sessions_open", "Streams this router is proxying now", registry=r
        )
        self.admissions = prometheus_client.Counter(
            "asrpool_router_admissions", "Streams admitted", ["pool", "kind"], registry=r
        )
        self.rejections = prometheus_client.Counter(
            "asrpool_router_rejections", "Streams refused, by reason", ["reason"], registry=r
        )
        self.free_slots = prometheus_client.Gauge(
            "asrpool_router_free_slots",
            "Free slots per pool, as admission counts them",
            ["pool"],
            registry=r,
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
        # The configured prices, so that dashboards compute cost from one setting.
        self.gpu_hour_price = prometheus_client.Gauge(
            "asrpool_router_gpu_hour_price_dollars",
            "Configured price of one GPU-hour (NaN: not configured)",
            registry=r,
        )
        self.gpus_per_pod = prometheus_client.Gauge(
            "asrpool_router_gpus_per_pod", "Configured GPUs of one server pod", registry=r
        )
        self.gpu_hour_price.set(math.nan)
        self.gpus_per_pod.set(1)

    def publish_pricing(self, gpu_hour_price: float | None, gpus_per_pod: float) -> None:
        self.gpu_hour_price.set(math.nan if gpu_hour_price is None else gpu_hour_price)
        self.gpus_per_pod.set(gpus_per_pod)

    def exposition(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)
