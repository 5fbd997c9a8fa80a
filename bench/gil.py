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

    asrpool bench gil --model tiny --batch 16 --busy 0,0.5,0.9 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
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
    parser.add_argument("--busy", default="0,0.5,0.9",
                        help="comma-separated shares of the time the loop is busy")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    args.loads = [float(x) for x in args.busy.split(",")]
    if not all(0 <= load < 1 for load in args.loads):
        parser.error(f"--busy: each share must be in [0, 1), got {args.busy}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    spec = enginechild.EngineSpec(args.model, args.batch, torch_threads=args.torch_threads)
    samples: dict[str, dict[float, list[tuple[float, float]]]] = {
        m: {b: [] for b in args.loads} for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            for load, times in _round(spec, mode, args).items():
                samples[mode][load].append(times)
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


def _round(spec: enginechild.EngineSpec, mode: str,
           args: argparse.Namespace) -> dict[float, tuple[float, float]]:
    """Median step and median hand-over (ms) at each load, one runner for them all."""
    runner = _runner(spec, mode)
    try:
        runner.ready()
        step = _stepper(runner, spec.batch_size)
        for _ in range(3):
            step()
        return {load: _timed(step, args.steps, load) for load in args.loads}
    finally:
        runner.close()


def _stepper(runner: engine_loop.Runner, batch: int) -> Callable[[], float]:
    rng = np.random.default_rng(0)
    frames = {slot: (0.1 * rng.standard_normal(slots.FRAME_SIZE)).astype(np.float32)
              for slot in range(batch)}
    generations = dict.fromkeys(frames, 1)

    def step() -> float:
        """The engine's own seconds in the step (the rest is the hand-over)."""
        return runner.run(slots.Batch(generations, [], [], [], frames,
                                      dict.fromkeys(frames, time.monotonic()),
                                      dict.fromkeys(frames, 0))).duration
    return step


def _timed(step: Callable[[], float], steps: int, load: float) -> tuple[float, float]:
    stop = threading.Event()
    loop = threading.Thread(target=_busy_loop, args=(load, stop), daemon=True)
    loop.start()
    try:
        times, handovers = [], []
        for _ in range(steps):
            started = time.perf_counter()
            engine_s = step()
            times.append(time.perf_counter() - started)
            handovers.append(times[-1] - engine_s)
    finally:
        stop.set()
        loop.join()
    return statistics.median(times) * 1e3, statistics.median(handovers) * 1e3


def _busy_loop(load: float, stop: threading.Event) -> None:
    """Decode 80 ms Audio messages for ``load`` of every 10 ms (none at 0)."""
    message = msgpack.packb({"type": "Audio", "pcm": [0.1] * protocol.FRAME_SIZE},
                            use_single_float=True)
    while not stop.is_set():
        until = time.perf_counter() + load * SLICE_S
        while time.perf_counter() < until:
            msgpack.unpackb(message)
        time.sleep((1 - load) * SLICE_S)


def _result(args: argparse.Namespace,
            samples: dict[str, dict[float, list[tuple[float, float]]]]) -> dict[str, Any]:
    rows = []
    for load in args.loads:
        thread = statistics.median(step for step, _ in samples["thread"][load])
        process = statistics.median(step for step, _ in samples["process"][load])
        handover = statistics.median(h for _, h in samples["process"][load])
        rows.append({"loop_busy": load, "thread_step_ms": round(thread, 2),
                     "process_step_ms": round(process, 2),
                     "process_over_thread": round(process / thread, 3),
                     "process_handover_ms": round(handover, 3),
                     "rounds_ms": {mode: [round(step, 2) for step, _ in samples[mode][load]]
                                   for mode in MODES}})
    return {"benchmark": "gil", "model": args.model, "batch": args.batch, "steps": args.steps,
            "rounds": args.rounds, "torch_threads": args.torch_threads,
            "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
            "load_average_at_end": os.getloadavg(), "loads": rows}


def _print(result: dict[str, Any], path: Path) -> None:
    print(f"gil: {result['model']} x{result['batch']} -> {path}")
    for row in result["loads"]:
        print(f"  loop busy {row['loop_busy']:.0%}: step {row['thread_step_ms']:.1f} ms in the "
              f"engine thread, {row['process_step_ms']:.1f} ms in an engine process "
              f"(x{row['process_over_thread']:.2f}; its hand-over "
              f"{row['process_handover_ms']:.2f} ms)")
