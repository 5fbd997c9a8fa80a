"""The timeline PNG: arrivals, active streams against slots, pods, and the waiting room;
one column per run (``--compare``), shared axes so the runs read side by side."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asrpool.plan import scenarios, simulating


def draw(path: Path, outcomes: Sequence[simulating.Outcome]) -> None:
    try:
        import matplotlib
    except ImportError:
        raise scenarios.PlanError(
            "--png needs matplotlib: pip install 'asrpool[plan]'") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(4, len(outcomes), sharex=True, sharey="row", squeeze=False,
                                   figsize=(7 * len(outcomes), 9))
    for column, outcome in enumerate(outcomes):
        _column([row[column] for row in axes], outcome)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def _column(axes: list[Any], outcome: simulating.Outcome) -> None:
    line = outcome.timeline
    hours = [t / 3600.0 for t in line.at]
    per_minute = 60.0 / outcome.plan.sample_seconds
    arrivals, active, pods, queue = axes
    arrivals.plot(hours, [n * per_minute for n in line.arrivals], color="tab:blue")
    arrivals.set_ylabel("arrivals / min")
    arrivals.set_title(f"{outcome.plan.policy}, {outcome.plan.pool.slots_per_pod} slots/pod, "
                       f"{'autoscaled' if outcome.plan.pool.autoscaling.enabled else 'fixed'}")
    active.plot(hours, line.active, label="active streams", color="tab:green")
    active.plot(hours, line.slots, label="slots (serving pods)", color="tab:gray")
    active.legend(loc="upper left")
    pods.plot(hours, line.pods, color="tab:purple")
    pods.set_ylabel("pods")
    queue.plot(hours, line.waiting, label="waiting", color="tab:orange")
    queue.plot(hours, line.refused, label="refused in interval", color="tab:red")
    queue.legend(loc="upper left")
    queue.set_xlabel("simulated hours")
