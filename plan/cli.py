"""``asrpool plan``: simulate a pool over a day (or a replayed trace) and report its cost.

Registered into the ``asrpool`` command. Only argparse loads here: numpy and the
simulation load when the command runs, matplotlib only for ``--png``; never torch.
"""

from __future__ import annotations

import argparse
import copy
import math
import shlex
import sys
from typing import Any, NoReturn

PROG = "asrpool plan"
DEFAULT_MAX_SLOTS = 10_000_000  # no ceiling unless given (the CRD's own: spec.slots' maximum)


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be above zero, got {text}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _at_least_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def _whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


POSITIVE_INT, POSITIVE_FLOAT = _positive(int), _positive(float)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan", help="simulate a pool with the real placement policy and autoscaler",
        description="Simulate one pool over a day of Poisson arrivals (or a replayed trace) "
        "with the router's placement policy and waiting room and the operator's autoscaler; "
        "print peak and mean pods and GPUs, occupancy, waits, refusals, cut streams and "
        "the cost per audio-hour.")
    _traffic_flags(parser.add_argument_group("traffic"))
    _pool_flags(parser.add_argument_group("pool"))
    _scaling_flags(parser.add_argument_group("autoscaling (the operator's)"))
    _output_flags(parser.add_argument_group("output"))

    def one_line_error(message: str) -> NoReturn:  # argparse's usage block is noise here
        print(f"{PROG}: {message}", file=sys.stderr)
        raise SystemExit(2)

    parser.error = one_line_error  # type: ignore[method-assign]
    parser.set_defaults(handler=run, plan_parser=parser)


def _traffic_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--trace", metavar="CSV",
                       help="replay sessions from a CSV with columns start_s,duration_s")
    group.add_argument("--peak-streams", type=POSITIVE_FLOAT, metavar="N",
                       help="concurrent streams at the daily peak (sets the arrival rate)")
    group.add_argument("--rate", type=POSITIVE_FLOAT, metavar="PER_S",
                       help="arrivals per second at the daily peak (instead of --peak-streams)")
    group.add_argument("--mean-duration", type=POSITIVE_FLOAT, default=300.0, metavar="S",
                       help="mean session length, seconds (lognormal; default 300)")
    group.add_argument("--duration-sigma", type=_at_least_zero, default=1.0,
                       help="spread of the session length's logarithm (default 1.0)")
    group.add_argument("--trough", type=_at_least_zero, default=0.2,
                       help="rate at 04:00 as a fraction of the 16:00 peak (default 0.2)")
    group.add_argument("--hours", type=POSITIVE_FLOAT, default=24.0,
                       help="simulated hours from 00:00 (default 24)")
    group.add_argument("--cold-start", action=argparse.BooleanOptionalAction, default=False,
                       help="start with no open streams (default: as a day like it leaves them)")
    group.add_argument("--seed", type=int, default=0)


def _pool_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--slots-per-pod", type=POSITIVE_INT, metavar="B",
                       help="streams per pod (default: from --capacity-from)")
    group.add_argument("--capacity-from", metavar="FILE",
                       help="a bench capacity JSON (streams_per_gpu, model); default: the "
                       "newest measured (bench/results/capacity-*.json, shipped with asrpool)")
    group.add_argument("--model", help="pick the capacity result of this model")
    group.add_argument("--gpus-per-pod", type=POSITIVE_INT, default=1)
    group.add_argument("--pods", type=POSITIVE_INT,
                       help="pods at the start (default with --autoscale: the autoscaler's "
                       "recommendation for the streams open then)")
    group.add_argument("--startup-seconds", type=_at_least_zero, default=120.0,
                       help="a new pod's time to take streams: schedule, pull, load (120)")
    group.add_argument("--drain-grace-seconds", type=_whole, default=60,
                       help="drainGracePeriodSeconds: a drained pod's streams are cut then (60)")
    group.add_argument("--policy", choices=["pack", "spread"], default="pack",
                       help="the router's placement policy (default pack)")
    group.add_argument("--queue-timeout-seconds", type=_at_least_zero, default=0.0, metavar="S",
                       help="the router's --queue-timeout-seconds: wait this long for a slot (0)")


def _scaling_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--autoscale", action=argparse.BooleanOptionalAction, default=False,
                       help="spec.autoscaling.enabled (default: a fixed --pods)")
    group.add_argument("--min-slots", type=_whole, default=0, help="minSlots (default 0)")
    group.add_argument("--max-slots", type=_whole, default=DEFAULT_MAX_SLOTS,
                       help="maxSlots (default: no ceiling)")
    group.add_argument("--target-free", type=_at_least_zero, default=0.25,
                       help="targetFreeFraction (default 0.25)")
    group.add_argument("--scale-up-window", type=_at_least_zero, default=0.0, metavar="S",
                       help="scaleUpStabilizationSeconds (default 0)")
    group.add_argument("--scale-down-window", type=_at_least_zero, default=300.0, metavar="S",
                       help="scaleDownStabilizationSeconds (default 300)")
    group.add_argument("--resync-seconds", type=POSITIVE_FLOAT, default=15.0,
                       help="the operator's --resync-seconds: one autoscaler pass each (15)")


def _output_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--gpu-hour-price", type=_at_least_zero, default=2.0, metavar="PRICE",
                       help="price of one GPU-hour, for the cost per audio-hour (default 2.0)")
    group.add_argument("--json", metavar="FILE", help="write the results (and wall time) here")
    group.add_argument("--png", metavar="FILE", help="draw the timeline here (needs matplotlib)")
    group.add_argument("--compare", metavar="FLAGS",
                       help="a second run with these flags over the first's, side by side, "
                       "e.g. --compare '--policy spread' or '--target-free 0.1'")


def run(args: argparse.Namespace) -> int:
    from asrpool.plan import planning, scenarios

    try:
        runs = [args] + ([_second(args)] if args.compare else [])
        return planning.main(runs)
    except scenarios.PlanError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2


def _second(args: argparse.Namespace) -> argparse.Namespace:
    """The first run's flags with the ``--compare`` ones on top."""
    parser: argparse.ArgumentParser = args.plan_parser
    flags = shlex.split(args.compare)
    if "--compare" in flags:
        parser.error("--compare: the second run cannot itself --compare")
    second = parser.parse_args(flags, namespace=copy.copy(args))
    second.compare = None
    return second
