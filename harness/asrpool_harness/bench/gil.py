"""What the event loop's work costs the engine's steps: the engine in the pod's engine
thread (one GIL with the loop) against the engine in a child process (``--engine-process``).

A busy thread stands for the event loop: in every 10 ms it decodes ``Audio`` messages
(msgpack, as a pod's intake does) for ``busy`` of the time and sleeps for the rest. Each
round runs both ways side by side, alternating, and times ``--steps`` engine steps of
``--batch`` streams through the pod's own runner (``engine_loop.InProcess`` or
``enginechild.ChildRunner``) at each load, and for the child the hand-over: a step's
time less the engine's own (frames into the shared array, the batch and its output
through the pipe). Writes ``gil-<model>-b<batch>.json``.

On a GPU most of a step is spent waiting on the device with the GIL released, and the
loop then holds it; on the CPU the engine's own arithmetic also runs with the GIL
released, so these figures show the mechanism, not a GPU's numbers (``bench/gpu-check``
runs ``bench server`` both ways for those).

    asrpool bench gil --model tiny --batch 16 --busy 0,0.5,0.75 --switch-ms 5,0.2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from asrpool.common import protocol
from asrpool.server import engine_loop, enginechild, slots

MODES = ("thread", "process")
SLICE_S = 0.01


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asrpool bench gil", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per load")
    parser.add_argument("--busy", default="0,0.5,0.75",
                        help="comma-separated shares of the time the loop is busy")
    parser.add_argument("--switch-ms", default="5,0.2",
                        help="comma-separated switch intervals of the GIL (ms)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    args.loads = [float(x) for x in args.busy.split(",")]
    if not all(0 <= load < 1 for load in args.loads):
        parser.error(f"--busy: each share must be in [0, 1), got {args.busy}")
    args.switches = [float(x) for x in args.switch_ms.split(",")]
    if not all(0 < switch <= 1000 for switch in args.switches):
        parser.error(f"--switch-ms: each interval must be in (0, 1000] ms, got {args.switch_ms}")
    return args


Sample = tuple[float, float, float]  # median step (ms), median hand-over (ms), loop rate
Samples = dict[tuple[str, float, float], list[Sample]]  # (mode, switch ms, load) -> rounds


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    spec = enginechild.EngineSpec(args.model, args.batch, torch_threads=args.torch_threads)
    samples: Samples = {}
    for _ in range(args.rounds):
        for switch in args.switches:
            for mode in MODES:
                for load, sample in _round(spec, mode, switch, args).items():
                    samples.setdefault((mode, switch, load), []).append(sample)
    result = _result(args, samples)
    path = Path(args.out) / f"gil-{args.model}-b{args.batch}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    _print(result, path)
    return 0


def _runner(spec: enginechild.EngineSpec, mode: str) -> engine_loop.Runner:
    if mode == "process":
        return enginechild.ChildRunner(spec, warmup_steps=2)
    return engine_loop.InProcess(lambda: enginechild.build_engine(spec), warmup_steps=2)


def _round(spec: enginechild.EngineSpec, mode: str, switch_ms: float,
           args: argparse.Namespace) -> dict[float, Sample]:
    """Each load's sample, one runner for them all, under the given switch interval."""
    runner = _runner(spec, mode)
    default = sys.getswitchinterval()
    try:
        runner.ready()
        step = _stepper(runner, spec.batch_size)
        for _ in range(3):
            step()
        sys.setswitchinterval(switch_ms / 1e3)
        return {load: _timed(step, args.steps, load) for load in args.loads}
    finally:
        sys.setswitchinterval(default)
        runner.close()


def _stepper(runner: engine_loop.Runner, batch: int) -> Callable[[], float]:
    rng = np.random.default_rng(0)
    frames = {slot: (0.1 * rng.standard_normal(slots.FRAME_SIZE)).astype(np.float32)
              for slot in range(batch)}
    generations = dict.fromkeys(frames, 1)

    def step() -> float:
        """The step's hand-over, as the runner measures it (0 in the engine thread)."""
        return runner.run(slots.Batch(generations, [], [], [], frames,
                                      dict.fromkeys(frames, time.monotonic()),
                                      dict.fromkeys(frames, 0))).handover
    return step


def _timed(step: Callable[[], float], steps: int, load: float) -> Sample:
    stop = threading.Event()
    busy = _BusyLoop(load)
    loop = threading.Thread(target=busy.run, args=(stop,), daemon=True)
    loop.start()
    try:
        times, handovers = [], []
        for _ in range(steps):
            started = time.perf_counter()
            handovers.append(step())
            times.append(time.perf_counter() - started)
    finally:
        stop.set()
        loop.join()
    return statistics.median(times) * 1e3, statistics.median(handovers) * 1e3, busy.rate()


class _BusyLoop:
    """Decodes 80 ms Audio messages for ``load`` of every 10 ms (none at 0), counting
    them and the time it spent busy."""

    def __init__(self, load: float) -> None:
        self.load = load
        self.decoded = 0
        self.busy_s = 0.0

    def run(self, stop: threading.Event) -> None:
        message = msgpack.packb({"type": "Audio", "pcm": [0.1] * protocol.FRAME_SIZE},
                                use_single_float=True)
        while not stop.is_set():
            started = time.perf_counter()
            until = started + self.load * SLICE_S
            while time.perf_counter() < until:
                msgpack.unpackb(message)
                self.decoded += 1
            self.busy_s += time.perf_counter() - started
            time.sleep((1 - self.load) * SLICE_S)

    def rate(self) -> float:
        """Messages decoded per second of busy time (0 for an idle loop)."""
        return self.decoded / self.busy_s if self.decoded else 0.0


def _result(args: argparse.Namespace, samples: Samples) -> dict[str, Any]:
    rows = []
    for switch in args.switches:
        for load in args.loads:
            runs = {mode: samples[(mode, switch, load)] for mode in MODES}
            thread = _median(runs["thread"], 0)
            process = _median(runs["process"], 0)
            rows.append({
                "switch_ms": switch, "loop_busy": load, "thread_step_ms": round(thread, 2),
                "process_step_ms": round(process, 2),
                "process_over_thread": round(process / thread, 3),
                "process_handover_ms": round(_median(runs["process"], 1), 3),
                "loop_decodes_per_busy_s": {mode: round(_median(runs[mode], 2))
                                            for mode in MODES},
                "rounds_ms": {mode: [round(sample[0], 2) for sample in runs[mode]]
                              for mode in MODES}})
    return {"benchmark": "gil", "model": args.model, "batch": args.batch, "steps": args.steps,
            "rounds": args.rounds, "torch_threads": args.torch_threads,
            "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "load_average_at_end": os.getloadavg(), "loads": rows}


def _median(runs: list[Sample], field: int) -> float:
    return statistics.median(sample[field] for sample in runs)


def _print(result: dict[str, Any], path: Path) -> None:
    print(f"gil: {result['model']} x{result['batch']} -> {path}")
    for row in result["loads"]:
        rate = row["loop_decodes_per_busy_s"]
        print(f"  switch {row['switch_ms']:g} ms, loop busy {row['loop_busy']:.0%}: step "
              f"{row['thread_step_ms']:.1f} ms in the engine thread, "
              f"{row['process_step_ms']:.1f} ms in an engine process "
              f"(x{row['process_over_thread']:.2f}; its hand-over "
              f"{row['process_handover_ms']:.2f} ms); the loop decoded {rate['thread']} / "
              f"{rate['process']} messages per busy second")
