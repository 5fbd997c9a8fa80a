"""What a simulated run comes to: the summary (JSON-ready), a text table, notes.

Definitions: pods and GPUs count every pod that exists (starting, serving or draining:
all hold their GPUs); slot occupancy is audio served over slot time paid for; waits
are over admitted streams, nearest-rank percentiles; the cost per audio-hour is GPU
hours times the price over the hours of audio served.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Callable, Sequence
from typing import Any

from asrpool.common import crd, limits
from asrpool.plan import simulating


def summary(outcome: simulating.Outcome, price: float, label: str = "") -> dict[str, Any]:
    c, plan = outcome.counts, outcome.plan
    hours = outcome.horizon / 3600.0
    gpu_hours = c.pod_seconds * plan.gpus_per_pod / 3600.0
    audio_hours = c.audio_seconds / 3600.0
    per_pod = plan.pool.slots_per_pod
    out: dict[str, Any] = {
        "label": label,
        "simulated_hours": round(hours, 4),
        "settings": settings(plan),
        "arrivals": c.arrivals, "open_at_start": outcome.carried, "admitted": c.admitted,
        "queued": c.queued, "refused": c.refused, "waiting_at_end": c.waiting_at_end,
        "refusal_rate": _ratio(c.refused, c.arrivals),
        "streams_cut": c.cut,
        "peak_streams": c.peak_streams,
        "peak_pods": c.peak_pods, "mean_pods": _ratio(c.pod_seconds, outcome.horizon),
        "peak_gpus": c.peak_pods * plan.gpus_per_pod,
        "mean_gpus": _ratio(c.pod_seconds * plan.gpus_per_pod, outcome.horizon),
        "peak_slots": max(outcome.timeline.slots, default=plan.pool.slots),
        "slot_occupancy": _ratio(c.audio_seconds, c.pod_seconds * per_pod),
        "wait_seconds": waits(c),
        "audio_hours": round(audio_hours, 3), "gpu_hours": round(gpu_hours, 3),
        "gpu_hour_price": price, "cost": round(gpu_hours * price, 2),
        "cost_per_audio_hour": _ratio(gpu_hours * price, audio_hours),
    }
    out["notes"] = notes(out, plan)
    return out


def settings(plan: simulating.Plan) -> dict[str, Any]:
    scaling = plan.pool.autoscaling
    return {
        "slots_per_pod": plan.pool.slots_per_pod, "gpus_per_pod": plan.gpus_per_pod,
        "pods_at_start": plan.pool.pods, "policy": plan.policy,
        "queue_timeout_seconds": plan.queue_timeout_seconds,
        "startup_seconds": plan.startup_seconds,
        "drain_grace_seconds": plan.pool.drain_grace_seconds,
        "autoscaling": {"enabled": scaling.enabled, "min_slots": scaling.min_slots,
                        "max_slots": scaling.max_slots,
                        "target_free_fraction": scaling.target_free_fraction,
                        "scale_up_seconds": scaling.scale_up_seconds,
                        "scale_down_seconds": scaling.scale_down_seconds,
                        "resync_seconds": plan.resync_seconds},
    }


def waits(counts: simulating.Counts) -> dict[str, float]:
    """p50/p99/max of the wait of admitted streams (most wait 0: only queued ones are kept)."""
    queued = sorted(counts.waits)
    zeros = counts.admitted - len(queued)

    def at(q: float) -> float:
        rank = max(1, math.ceil(q * counts.admitted)) - 1
        return 0.0 if rank < zeros else round(queued[rank - zeros], 3)

    if not counts.admitted:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0}
    return {"p50": at(0.5), "p99": at(0.99), "max": round(queued[-1], 3) if queued else 0.0}


def notes(out: dict[str, Any], plan: simulating.Plan) -> list[str]:
    """What the SRE should know before applying this pool."""
    found = []
    if out["streams_cut"]:
        found.append(f"{out['streams_cut']} streams were cut when their drained pod's grace "
                     f"({plan.pool.drain_grace_seconds} s) ran out: raise "
                     "drainGracePeriodSeconds or the scale-down window")
    most_slots = crd.at(crd.pool_spec(), "slots")["maximum"]
    if out["peak_slots"] > most_slots:
        found.append(f"the pool peaked at {out['peak_slots']} slots, over the CRD's "
                     f"{most_slots} per pool: split the traffic across pools")
    if plan.pool.slots_per_pod > limits.MAX_SLOTS_PER_POD:
        found.append(f"{plan.pool.slots_per_pod} slots per pod is over the CRD's "
                     f"slotsPerPod maximum of {limits.MAX_SLOTS_PER_POD}")
    return found


def table(summaries: Sequence[dict[str, Any]]) -> str:
    """The headline numbers, one column per run."""
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("run", lambda s: s["label"]),
        ("arrivals / admitted", lambda s: f"{s['arrivals']} / {s['admitted']}"),
        ("queued / refused", lambda s: f"{s['queued']} / {s['refused']}"),
        ("refusal rate", lambda s: f"{s['refusal_rate']:.4%}"),
        ("streams cut", lambda s: str(s["streams_cut"])),
        ("wait p50 / p99 (s)", lambda s: f"{s['wait_seconds']['p50']:g} / "
                                         f"{s['wait_seconds']['p99']:g}"),
        ("peak streams", lambda s: str(s["peak_streams"])),
        ("pods peak / mean", lambda s: f"{s['peak_pods']} / {s['mean_pods']:.1f}"),
        ("GPUs peak / mean", lambda s: f"{s['peak_gpus']} / {s['mean_gpus']:.1f}"),
        ("slot occupancy", lambda s: f"{s['slot_occupancy']:.1%}"),
        ("audio hours", lambda s: f"{s['audio_hours']:.1f}"),
        ("GPU hours", lambda s: f"{s['gpu_hours']:.1f}"),
        ("cost per audio-hour", lambda s: f"{s['cost_per_audio_hour']:.4f}"),
    ]
    cells = [[name] + [render(s) for s in summaries] for name, render in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def timeline(outcome: simulating.Outcome) -> dict[str, list[float] | list[int]]:
    line = outcome.timeline
    return {"at_seconds": line.at, "arrivals": line.arrivals, "active": line.active,
            "slots": line.slots, "pods": line.pods, "waiting": line.waiting,
            "refused": line.refused}


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "processor": platform.processor() or platform.machine()}


def _ratio(num: float, den: float) -> float:
    return round(num / den, 6) if den else 0.0
