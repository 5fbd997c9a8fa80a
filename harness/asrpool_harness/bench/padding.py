"""First-frame padding: what moshi-server's zero padding changes against asrpool's.

Mimi's downsampling convolution (``moshi.modules.resample.ConvDownsample1d``, kernel 4,
stride 2) pads a stream's first frame on the left. Python moshi, and so asrpool, pads it
with the frame's first sample (``pad_mode="replicate"``); moshi-server pads it with
zeros (its per-slot reset leaves the convolution's "left pad applied" flag set after its
warm-up, so every stream's first frame sees zeros). asrpool keeps the model's own
padding; this benchmark measures the difference: each stream's audio goes through two
rows of one engine at once, one padded as asrpool pads it and one as moshi-server does,
and their audio codes and text tokens are compared step by step. Writes
``bench/results/padding-MODEL-DEVICE.json``.

    asrpool bench padding --model small --streams 8 --seconds 10
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from moshi.modules import conv
from numpy.typing import NDArray

from asrpool.bench import devices
from asrpool.bench.synthetic import speechlike
from asrpool.common import protocol
from asrpool.server import engine

FRAME_SIZE = protocol.FRAME_SIZE


@dataclasses.dataclass
class Difference:
    """One stream: where its two paddings disagree."""

    steps: int
    code_steps: int = 0  # steps whose audio codes differ in some codebook
    codes: int = 0  # differing codes over all steps and codebooks
    first_step_codes: int = 0  # of them in the first step
    last_code_step: int = -1  # the last step whose codes differ (-1: none)
    text_tokens: int = 0  # steps whose text token differs
    first_text_step: int = -1  # the first (-1: none)


def pad_like_moshi_server(mimi: torch.nn.Module, row: int) -> None:
    """Make ``row``'s next frame (a stream's first) zero-padded in every replicate-padded
    streaming convolution, as moshi-server's is: clear the "first frame" flag that makes
    moshi replicate the first sample (the padding buffer after a reset is zeros)."""
    for module in mimi.modules():
        if isinstance(module, conv.StreamingConv1d) and module.pad_mode == "replicate":
            state = module._streaming_state
            assert state is not None, "only inside the engine's streaming context"
            state.first[row] = False


def compare(eng: engine.BatchedEngine, streams: list[NDArray[np.float32]]) -> list[Difference]:
    """Stream i in rows 2i (asrpool's padding) and 2i+1 (moshi-server's), in one batch."""
    rows = range(2 * len(streams))
    eng.reset_slots(rows)
    for i in range(len(streams)):
        pad_like_moshi_server(eng.model.mimi, 2 * i + 1)
    steps = min(len(pcm) for pcm in streams) // FRAME_SIZE
    found = [Difference(steps) for _ in streams]
    for step in range(steps):
        frames = {row: streams[row // 2][step * FRAME_SIZE:(step + 1) * FRAME_SIZE]
                  for row in rows}
        result = eng.step(frames)
        for i, difference in enumerate(found):
            _note(difference, step, result, 2 * i)
    return found


def _note(difference: Difference, step: int, result: engine.StepResult, row: int) -> None:
    ours, theirs = result.audio_codes[row], result.audio_codes[row + 1]
    differing = sum(a != b for a, b in zip(ours, theirs, strict=True))
    if differing:
        difference.code_steps += 1
        difference.codes += differing
        difference.last_code_step = step
        if step == 0:
            difference.first_step_codes = differing
    if result.text_tokens[row] != result.text_tokens[row + 1]:
        difference.text_tokens += 1
        if difference.first_text_step < 0:
            difference.first_text_step = step


def summary(found: list[Difference], codebooks: int) -> dict[str, Any]:
    def mean(values: list[int]) -> float:
        return statistics.fmean(values) if values else 0.0

    return {
        "streams": len(found),
        "steps_per_stream": found[0].steps if found else 0,
        "codebooks": codebooks,
        "streams_with_code_differences": sum(d.codes > 0 for d in found),
        "mean_differing_codes_first_step": mean([d.first_step_codes for d in found]),
        "mean_differing_codes": mean([d.codes for d in found]),
        "max_last_differing_code_step": max((d.last_code_step for d in found), default=-1),
        "streams_with_text_differences": sum(d.text_tokens > 0 for d in found),
        "mean_differing_text_tokens": mean([d.text_tokens for d in found]),
    }


# The command: ``asrpool bench padding``.


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asrpool bench padding", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small",
                        help="a preset with Mimi's real architecture (small, stt-1b-en_fr, ...)"
                             " or a checkpoint")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", default="bench/results")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        device = devices.resolve(args.device)
        if args.streams < 1 or args.seconds * protocol.FRAME_RATE < 1:
            raise devices.BadInput("padding needs --streams >= 1 and a frame of --seconds")
        model = devices.load_model(args.model, device)
    except devices.BadInput as exc:
        print(f"asrpool bench padding: {exc}", file=sys.stderr)
        return 2
    streams = [speechlike(args.seconds, args.seed + i) for i in range(args.streams)]
    with engine.BatchedEngine(model, 2 * args.streams) as eng:
        found = compare(eng, streams)
    result = {"benchmark": "padding", "model": model.model_id, "device": device.type,
              **summary(found, model.lm.num_audio_codebooks),
              "per_stream": [dataclasses.asdict(d) for d in found]}
    path = Path(args.out) / f"padding-{args.model.replace('/', '_')}-{device.type}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"padding: {result['streams_with_code_differences']} of {args.streams} streams' codes"
          f" differ (first step: {result['mean_differing_codes_first_step']:.1f} of"
          f" {result['codebooks']} codes on average, the last at step"
          f" {result['max_last_differing_code_step']}); text tokens differ in"
          f" {result['streams_with_text_differences']} -> {path}")
    return 0
