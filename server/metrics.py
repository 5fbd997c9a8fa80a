"""Prometheus metrics of one server pod, on a registry of its own (no global state).

Names follow moshi-server where it has them (``asr_open_channels``,
``asr_model_step_duration``, ``asr_connect``); the rest are asrpool's.
"""

from __future__ import annotations

import prometheus_client as prom

CONTENT_TYPE = prom.CONTENT_TYPE_LATEST
_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
_LAG_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry(auto_describe=True)
        r = self.registry
        self.open_channels = prom.Gauge(
            "asr_open_channels", "Websocket streams attached to a slot", registry=r)
        self.model_step_duration = prom.Histogram(
            "asr_model_step_duration", "Seconds per batched model step", registry=r,
            buckets=_STEP_BUCKETS)
        self.engine_handover = prom.Histogram(
            "asr_engine_handover_seconds",
            "Seconds per step beyond the model's, handing the batch to the engine process "
            "and its results back (--engine-process)", registry=r, buckets=_STEP_BUCKETS)
        self.connect = prom.Counter(
            "asr_connect", "Websocket connections accepted into a slot", registry=r)
        self.slots_total = prom.Gauge("asr_slots_total", "Stream slots of this pod", registry=r)
        self.slots_free = prom.Gauge(
            "asr_slots_free", "Slots free (a stream in resume grace holds its slot)", registry=r)
        self.step_lag = prom.Histogram(
            "asr_step_lag_seconds",
            "Seconds from a frame's arrival to its step's output (lag behind real time)",
            registry=r, buckets=_LAG_BUCKETS)
        self.buffered_audio = prom.Gauge(
            "asr_buffered_audio_seconds", "Audio waiting for the engine, all slots", registry=r)
        self.batch_rows = prom.Histogram(
            "asr_batch_rows", "Slots with a frame in each step", registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        self.errors = prom.Counter(
            "asr_errors", "Error messages sent to clients, by code", ["code"], registry=r)
        self.resumes = prom.Counter(
            "asr_resumes", "Streams reattached with a resume token", registry=r)
        self.draining = prom.Gauge("asr_draining", "1 while the pod drains", registry=r)
        self.overloaded = prom.Gauge(
            "asr_overloaded", "1 while the pod is behind real time and admits no new stream "
            "(serve --overload-seconds)", registry=r)
        self.auto_step = prom.Gauge(
            "asr_auto_batch_step_p99_seconds",
            "With --batch-size auto: the p99 step the pod measured at start-up for the "
            "slots it serves (absent otherwise)", registry=r)
        self.shed = prom.Counter(
            "asr_shed_streams", "Streams ended (Error overloaded) because the pod fell too "
            "far behind real time (serve --shed-seconds)", registry=r)
        self.paced_engine = prom.Gauge(
            "asr_paced_engine",
            "1: the engine is a paced stand-in (serve --paced-engine), no model runs; the "
            "model and the device whose bench capacity result times its steps",
            ["model", "measured_on"], registry=r)
        self.intake_restarts = prom.Counter(
            "asr_intake_restarts", "Intake processes that ended and were started again "
            "(their streams ended with an Error internal; serve --intake-workers)", registry=r)
        self.audio_seconds = prom.Counter(
            "asr_audio_seconds",
            "Seconds of stream audio the engine has transcribed (80 ms per slot per step); "
            "with a price per GPU-hour, cost per audio-hour is price / rate", registry=r)

    def exposition(self) -> bytes:
        return prom.generate_latest(self.registry)
