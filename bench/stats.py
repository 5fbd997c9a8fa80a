"""Latency percentiles, as every benchmark reports them."""

from __future__ import annotations

import statistics


def percentiles(samples: list[float], digits: int | None = None) -> dict[str, float | int]:
    """n, p50, p99, max and mean of ``samples`` (seconds), in milliseconds; rounded to
    ``digits`` when given. ``{"n": 0}`` for none."""
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)

    def ms(seconds: float) -> float:
        value = seconds * 1e3
        return value if digits is None else round(value, digits)

    def at(q: float) -> float:
        return ms(ordered[min(len(ordered) - 1, int(q * len(ordered)))])

    return {"n": len(ordered), "p50_ms": at(0.5), "p99_ms": at(0.99),
            "max_ms": ms(ordered[-1]), "mean_ms": ms(statistics.fmean(ordered))}
