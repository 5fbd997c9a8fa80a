"""The pod's host work per stream-step, this tree against an earlier commit, side by side.

    asrpool bench hostwork --before REF [--models tiny,small] [--inputs pcm-80ms,opus]

Host work is what ``bench capacity`` counts beside the engine: each stream's messages
decoded into its slot's buffer (``bench/intake.py``), the batch taken, the step's events
delivered and sent (``capacity.PodStep``), less the model step itself. Each measurement
runs in a child process of its own, the two trees alternating round after round on the
same machine, so that load from elsewhere falls on both alike; the earlier tree is a git
worktree of REF whose folders are laid out as the installed package (``asrpool.server``
from ``server/``, ...) and put first on the child's path.

Three figures per step: wall time, the CPU time of the pod's process
(``time.process_time``, as ``bench capacity`` counts host work: not the time the machine
gave to other processes, so steadier here), and the CPU time of its children (the Opus
lanes' decoding processes, from the kernel's CPU clocks).
Writes ``hostwork.json`` (medians per side and the ratio).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from asrpool.bench import reports
from asrpool.common import processes

REPO = Path(__file__).resolve().parents[3]  # harness/asrpool_harness/bench/: the checkout
# Package name -> folder of the checkout (pyproject's package-dir).
_LAYOUT = {"server": "server", "router": "router", "operator": "operator", "bench": "bench",
           "plan": "plan"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asrpool bench hostwork", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="git commit to compare against")
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--inputs", default="pcm-80ms,pcm-1s,opus",
                        help="input kinds (bench/intake.py); KIND:EARLIER measures this "
                        "tree's KIND against the earlier tree's EARLIER")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--measure", nargs=4, metavar=("MODEL", "INPUT", "BATCH", "STEPS"),
                        help=argparse.SUPPRESS)  # the child's part
    return parser.parse_args(argv)


# The child: one model, one input kind, in whichever tree is first on its path.


def measure(model_name: str, kind: str, batch: int, steps: int) -> dict[str, float]:
    """``capacity.PodStep``'s parts timed one by one: an earlier tree's ``PodStep`` does
    not return its CPU time (this loop must measure both trees alike)."""
    import torch

    from asrpool.bench import capacity, devices
    from asrpool.server import engine_loop

    torch.set_num_threads(1)
    pod = capacity.PodStep(devices.load_model(model_name, torch.device("cpu")), batch, kind,
                           steps + 5)
    for _ in range(5):
        pod()
    wall, cpu = [], []
    helpers_s = children_cpu_s()
    for _ in range(steps):
        started, started_cpu = time.perf_counter(), time.process_time()
        pod.intake.feed(pod.buffers, pod.calls)
        taken = pod.buffers.take()
        assert taken is not None
        engine_started, engine_cpu = time.perf_counter(), time.process_time()
        output = engine_loop.run_batch(pod.engine, taken)
        engine_wall = time.perf_counter() - engine_started
        engine_cpu = time.process_time() - engine_cpu
        pod.sessions.deliver(output)
        for stream in pod.streams:
            while stream.outbox:
                stream.mark_sent()
        pod.calls += 1
        wall.append(time.perf_counter() - started - engine_wall)
        cpu.append(time.process_time() - started_cpu - engine_cpu)
    helpers_s = children_cpu_s() - helpers_s
    pod.close()
    return {"wall_us": round(statistics.median(wall) * 1e6 / batch, 2),
            "cpu_us": round(statistics.median(cpu) * 1e6 / batch, 2),
            "helpers_cpu_us": round(helpers_s * 1e6 / steps / batch, 2)}


def children_cpu_s() -> float:
    """CPU seconds of this process's live children (an Opus intake's lanes, in either
    tree: defined here, as this file is always this tree's)."""
    pids = [int(pid) for task in Path("/proc/self/task").iterdir()
            for pid in (task / "children").read_text().split()]
    return sum(processes.cpu_seconds(pid) for pid in pids)


# The parent


@contextlib.contextmanager
def package_tree(ref: str) -> Iterator[Path]:
    """A worktree of ``ref`` and beside it a folder whose ``asrpool`` package maps the
    worktree's folders as the installed one does; that folder, for PYTHONPATH."""
    with tempfile.TemporaryDirectory(prefix="hostwork-") as tmp:
        worktree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree),
                        ref], check=True, capture_output=True)
        try:
            package = Path(tmp) / "path" / "asrpool"
            package.mkdir(parents=True)
            for item in (worktree / "asrpool").iterdir():
                (package / item.name).symlink_to(item)
            for name, folder in _LAYOUT.items():
                (package / name).symlink_to(worktree / folder)
            yield package.parent
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(worktree)], check=False, capture_output=True)


def run_child(path: Path | None, model: str, kind: str, opts: argparse.Namespace,
              log: Path) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONSAFEPATH="1")
    if path is not None:
        env["PYTHONPATH"] = str(path)
    before = log.stat().st_size if log.exists() else 0
    child = processes.spawn(f"hostwork {model} {kind}", [
        sys.executable, "-P", __file__, "--before", "-", "--measure", model, kind,
        str(opts.batch), str(opts.steps)], log, env=env)
    if child.process.wait() != 0:
        raise processes.StartError(f"{child.name} failed: {child.last_line()}")
    with log.open() as file:
        file.seek(before)
        lines = [line for line in file.read().splitlines() if line.startswith("{")]
    result: dict[str, float] = json.loads(lines[-1])
    return result


def compare(path: Path, opts: argparse.Namespace, log: Path) -> list[dict[str, Any]]:
    rows = []
    for model in opts.models.split(","):
        for item in opts.inputs.split(","):
            kind, _, earlier = item.partition(":")  # AFTER:BEFORE, a kind the earlier lacks
            sides: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for _ in range(opts.rounds):
                sides["before"].append(run_child(path, model, earlier or kind, opts, log))
                sides["after"].append(run_child(None, model, kind, opts, log))
            rows.append(_row(model, kind, sides) | {"input_before": earlier or kind})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _row(model: str, kind: str, sides: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    row: dict[str, Any] = {"model": model, "input": kind}
    for figure in ("wall_us", "cpu_us", "helpers_cpu_us"):
        before = statistics.median(run.get(figure, 0.0) for run in sides["before"])
        after = statistics.median(run.get(figure, 0.0) for run in sides["after"])
        row[figure] = {"before": before, "after": after,
                       "after_over_before": round(after / before, 3) if before else None,
                       "runs": {side: [run.get(figure, 0.0) for run in runs]
                                for side, runs in sides.items()}}
    return row


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    if opts.measure:
        model, kind, batch, steps = opts.measure
        print(json.dumps(measure(model, kind, int(batch), int(steps))), flush=True)
        return 0
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          check=True, capture_output=True, text=True).stdout.strip()
    started = time.monotonic()
    with package_tree(opts.before) as path:
        rows = compare(path, opts, out / "hostwork.log")
    reports.write(out, "hostwork.json", {
        "benchmark": "hostwork", "before": opts.before, "after": f"{head} (work tree)",
        "batch": opts.batch, "steps": opts.steps, "rounds": opts.rounds,
        **reports.machine(started), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
