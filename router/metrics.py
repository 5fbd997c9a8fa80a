"""Prometheus metrics of one router, in a registry of their own (no global state)."""

from __future__ import annotations

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

    def exposition(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)
