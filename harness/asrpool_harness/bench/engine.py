"""Engine benchmark: batched step time against the bare model step, side by side.

For each batch size, blocks of engine steps (masks, word decoding, one host sync a
step) alternate with blocks of the same forward pass called bare (batched Mimi encode
and LMGen step on preallocated tensors, one sync a block), so that machine noise hits
both alike. Writes JSON to ``bench/results/``.

    asrpool bench engine --model small --batch 1,8,32,64
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asrpool.server import engine, models

FRAME_SECONDS = 0.08


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asrpool bench engine", description=__doc__)
    parser.add_argument("--model", default="small")
    parser.add_argument("--batch", default="1,8,32,64", help="comma-separated batch sizes")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--blocks", type=int, default=3, help="timed blocks of each kind")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default="bench/results")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = models.default_dtype(device)
    model = models.load_model(args.model, device=device, dtype=dtype)
    rows = [measure(model, int(b), args) for b in args.batch.split(",")]
    result = {"benchmark": "engine", "model": args.model, "device": str(device),
              "dtype": str(dtype), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "machine": platform.processor() or platform.machine(), "batches": rows,
              "max_realtime_streams": max((r["batch_size"] for r in rows if r["realtime"]),
                                          default=0)}
    path = Path(args.out) / f"engine-{args.model}-{device.type}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    _print_table(result, path)
    return 0


def measure(model: models.LoadedModel, batch_size: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    frames = {s: (0.1 * rng.standard_normal(engine.FRAME_SIZE)).astype(np.float32)
              for s in range(batch_size)}
    with engine.BatchedEngine(model, batch_size) as eng:
        for slot in range(batch_size):
            eng.reset_slot(slot)
        bare = _BareStep(eng)
        for _ in range(args.warmup):
            eng.step(frames)
            bare()
        engine_times, bare_times = [], []
        for _ in range(args.blocks):
            engine_times.append(_time_block(lambda: eng.step(frames), args.steps, eng.device))
            bare_times.append(_time_block(bare, args.steps, eng.device))
        state_bytes = eng.state_nbytes()
    engine_s, bare_s = statistics.median(engine_times), statistics.median(bare_times)
    return {"batch_size": batch_size, "engine_step_ms": engine_s * 1e3,
            "model_step_ms": bare_s * 1e3, "engine_over_model": engine_s / bare_s,
            "realtime": engine_s <= FRAME_SECONDS,
            "realtime_factor": FRAME_SECONDS / engine_s,
            "state_mib": state_bytes / 2**20}


class _BareStep:
    """The engine's forward pass with every slot active and no bookkeeping."""

    def __init__(self, eng: engine.BatchedEngine) -> None:
        self.eng = eng
        self.pcm = torch.zeros(eng.batch_size, 1, engine.FRAME_SIZE, device=eng.device)
        self.pcm.normal_(std=0.1)
        eng.model.mimi.set_exec_mask(torch.ones(eng.batch_size, dtype=torch.bool,
                                                device=eng.device))

    @torch.no_grad()
    def __call__(self) -> None:
        with models.compile_policy(self.eng.device):
            codes = self.eng.model.mimi.encode(self.pcm)
            self.eng.lm_gen.step_with_extra_heads(codes)


def _time_block(fn: Any, steps: int, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / steps


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _print_table(result: dict[str, Any], path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"engine: {result['model']} on {result['device']} -> {path}")
    for column in ("batch", "engine ms", "model ms", "ratio", "x real time", "state MiB"):
        table.add_column(column, justify="right")
    for row in result["batches"]:
        table.add_row(str(row["batch_size"]), f"{row['engine_step_ms']:.1f}",
                      f"{row['model_step_ms']:.1f}", f"{row['engine_over_model']:.2f}",
                      f"{row['realtime_factor']:.2f}", f"{row['state_mib']:.1f}")
    Console().print(table)
