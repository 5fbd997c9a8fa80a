"""From the command's flags to runs of the simulation, and from those to the outputs.

The pool is built with the operator's own :func:`pools.from_body` from the spec the
flags describe, so a plan is checked as the operator would check that pool.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import typing
from pathlib import Path

from asrpool.operator import autoscaling, pools, specs
from asrpool.plan import capacities, reports, scenarios, simulating

Traffic = typing.Union[scenarios.Traffic, scenarios.Trace]  # noqa: UP007 (an alias at runtime)


def main(runs: list[argparse.Namespace]) -> int:
    """Simulate each run; print, and write the JSON and PNG the first run asks for."""
    results = [simulate(args) for args in runs]
    first = runs[0]
    if first.json:
        _write_json(Path(first.json), results)
    if first.png:
        from asrpool.plan import plotting

        plotting.draw(Path(first.png), [result.outcome for result in results])
    print(reports.table([result.summary for result in results]))
    for note in (note for result in results for note in result.summary["notes"]):
        print(f"note: {note}")
    return 0


@dataclasses.dataclass(frozen=True)
class Result:
    outcome: simulating.Outcome
    summary: dict[str, typing.Any]
    wall_seconds: float  # generating the traffic and simulating it
    cpu_seconds: float  # of this process meanwhile (less noisy on a shared machine)


def simulate(args: argparse.Namespace) -> Result:
    traffic = traffic_of(args)
    plan = plan_of(args, traffic)
    started, cpu = time.perf_counter(), time.process_time()
    outcome = simulating.Simulation(plan).run(*traffic.sessions(), traffic.horizon)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    summary = reports.summary(outcome, args.gpu_hour_price, label=_label(args))
    return Result(outcome, summary, wall, cpu)


def traffic_of(args: argparse.Namespace) -> Traffic:
    if args.trace:
        if args.peak_streams or args.rate:
            raise scenarios.PlanError(
                "--trace replays its own arrivals: drop --peak-streams and --rate")
        return scenarios.read_trace(Path(args.trace))
    if bool(args.peak_streams) == bool(args.rate):
        raise scenarios.PlanError("give one of --peak-streams N, --rate PER_S or --trace CSV")
    rate = args.rate or args.peak_streams / args.mean_duration
    return scenarios.Traffic(
        peak_rate=rate, mean_duration=args.mean_duration, duration_sigma=args.duration_sigma,
        hours=args.hours, trough=args.trough, seed=args.seed, warm=not args.cold_start)


def plan_of(args: argparse.Namespace, traffic: Traffic) -> simulating.Plan:
    pool = _pool(args, slots_per_pod(args))
    if args.pods is None:
        pool = dataclasses.replace(pool, slots=_starting_slots(pool, traffic))
    return simulating.Plan(
        pool=pool, policy=args.policy, queue_timeout_seconds=args.queue_timeout_seconds,
        startup_seconds=args.startup_seconds, resync_seconds=args.resync_seconds,
        gpus_per_pod=args.gpus_per_pod)


def slots_per_pod(args: argparse.Namespace) -> int:
    if args.slots_per_pod and args.capacity_from:
        raise scenarios.PlanError("give --slots-per-pod or --capacity-from, not both")
    if args.slots_per_pod:
        return int(args.slots_per_pod)
    found = (capacities.read(Path(args.capacity_from)) if args.capacity_from
             else capacities.newest(args.model))
    if found is None:
        raise scenarios.PlanError(
            f"give --slots-per-pod B or --capacity-from FILE (no capacity-*.json in"
            f" {capacities.RESULTS}"
            + (f" of model {args.model}" if args.model else "") + ")")
    return found.streams_per_gpu * int(args.gpus_per_pod)


def _pool(args: argparse.Namespace, per_pod: int) -> pools.Pool:
    scaling = {"enabled": bool(args.autoscale), "minSlots": args.min_slots,
               "maxSlots": args.max_slots, "targetFreeFraction": args.target_free,
               "scaleUpStabilizationSeconds": args.scale_up_window,
               "scaleDownStabilizationSeconds": args.scale_down_window}
    if not args.autoscale and args.pods is None:
        raise scenarios.PlanError("give --pods N (a fixed pool), or --autoscale")
    body = {"metadata": {"name": "plan"}, "spec": {
        # The model does not change a plan: any reference the operator accepts will do.
        "model": {"name": "tiny"}, "slots": (args.pods or 1) * per_pod,
        "slotsPerPod": per_pod, "drainGracePeriodSeconds": args.drain_grace_seconds,
        "resources": {"gpus": args.gpus_per_pod}, "autoscaling": scaling}}
    try:
        return pools.from_body(body)
    except specs.InvalidSpec as exc:
        raise scenarios.PlanError(str(exc)) from exc


def _starting_slots(pool: pools.Pool, traffic: Traffic) -> int:
    """What the autoscaler recommends for the streams open at the start."""
    return autoscaling.recommend(round(traffic.open_at_start), pool)


def _label(args: argparse.Namespace) -> str:
    scaling = (f"autoscale free {args.target_free:g}, down {args.scale_down_window:g} s"
               if args.autoscale else f"{args.pods} pods fixed")
    return f"{args.policy}, {scaling}"


def _write_json(path: Path, results: list[Result]) -> None:
    body = {
        "runs": [result.summary | {"wall_seconds": round(result.wall_seconds, 3),
                                   "cpu_seconds": round(result.cpu_seconds, 3),
                                   "timeline": reports.timeline(result.outcome)}
                 for result in results],
        "machine": reports.machine(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=1) + "\n")
