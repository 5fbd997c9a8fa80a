"""How fast the built-in autoscaler grows a full pool: demand of active streams only
(before issue 11) against active + waiting + refused clients (now).

A deterministic simulation of the operator's passes with the real policy
(:func:`asrpool.operator.autoscaling.step`, the HPA's default rate limits): ``clients``
want a stream at once; a new pod serves only ``load_seconds`` after the pass that asked
for it (the model load); every unserved client counts as waiting or refused at each
pass. Writes the passes and seconds until every client is served to JSON.

    python -m asrpool_harness.bench.autoscale_growth --out bench/results/autoscale-growth.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from asrpool.operator import autoscaling, pools


def pool(slots_per_pod: int, max_slots: int) -> pools.Pool:
    return pools.from_body({"metadata": {"name": "p"}, "spec": {
        "model": {"name": "m"}, "slots": slots_per_pod, "slotsPerPod": slots_per_pod,
        "autoscaling": {"enabled": True, "maxSlots": max_slots}}})


def run(scaled: pools.Pool, clients: int, count_unmet: bool, resync: float,
        load_seconds: float, passes: int = 200) -> dict[str, Any]:
    """Passes until ``clients`` streams run; the slots asked at each pass."""
    asked: list[tuple[float, int]] = []  # (ready at, slots)
    slots, state = scaled.slots, autoscaling.seeded(0.0, scaled.slots)
    ready = slots
    for step in range(passes):
        now = step * resync
        ready = max([scaled.slots] + [size for at, size in asked if at <= now])
        active = min(ready, clients)
        unmet = clients - active if count_unmet else 0
        state, decision = autoscaling.step(state, autoscaling.Demand(active, refused=unmet),
                                           now, slots, scaled)
        if decision.slots > slots:
            asked.append((now + load_seconds, decision.slots))
        slots = decision.slots
        if active >= clients:
            return {"passes": step, "seconds": now, "served": True}
    return {"passes": passes, "seconds": passes * resync, "served": ready >= clients}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--slots-per-pod", type=int, default=8)
    parser.add_argument("--max-slots", type=int, default=512)
    parser.add_argument("--resync-seconds", type=float, default=15.0)
    parser.add_argument("--load-seconds", type=float, nargs="+", default=[0.0, 60.0, 180.0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/autoscale-growth.json"))
    args = parser.parse_args(argv)
    scaled = pool(args.slots_per_pod, args.max_slots)
    results = [{"load_seconds": load,
                "active_only": run(scaled, args.clients, False, args.resync_seconds, load),
                "with_unmet": run(scaled, args.clients, True, args.resync_seconds, load)}
               for load in args.load_seconds]
    report = {"clients": args.clients, "slots_per_pod": args.slots_per_pod,
              "start_slots": scaled.slots, "resync_seconds": args.resync_seconds,
              "target_free_fraction": scaled.autoscaling.target_free_fraction,
              "wanted_slots": math.ceil(args.clients / 0.75), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
