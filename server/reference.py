"""An unbatched reference: one stream on moshi's own Mimi and LMGen at batch size 1.

It follows moshi's ``run_inference`` for STT models: the first frame's codes are fed
twice (the first LM step sees the initial tokens anyway), so the LM sees each frame
one step late, as in Kyutai's Rust server and in :mod:`asrpool.server.engine`.
Tests compare the engine with it stream by stream; the quantizer distances it
records show whether a differing code was a near tie.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import numpy as np
import torch
from moshi.models.lm import LMGen
from numpy.typing import NDArray

from asrpool.server import models
from asrpool.server.models import LoadedModel


@dataclasses.dataclass
class ReferenceRun:
    codes: list[list[int]]  # per frame, per codebook
    text_tokens: list[int]  # per LM step (one per frame)
    # per frame, per codebook: distance to every centroid
    distances: list[list[NDArray[np.float32]]]


def run_reference(model: LoadedModel, frames: list[NDArray[np.float32]]) -> ReferenceRun:
    """Encode and decode one stream's frames with batch-size-1 moshi modules."""
    lm_gen = LMGen(model.lm, use_sampling=False, temp=0.0, temp_text=0.0)
    run = ReferenceRun([], [], [])
    with contextlib.ExitStack() as stack, torch.no_grad():
        stack.enter_context(models.compile_policy(model.device))
        stack.enter_context(model.mimi.streaming(1))
        stack.enter_context(lm_gen.streaming(1))
        previous: torch.Tensor | None = None
        for frame in frames:
            pcm = torch.from_numpy(frame).to(model.device).view(1, 1, -1)
            latent = model.mimi._encode_to_unquantized_latent(pcm)
            codes, distances = quantize_with_distances(model, latent)
            lm_input = codes if previous is None else previous
            previous = codes
            tokens = lm_gen.step(lm_input)
            assert tokens is not None
            run.codes.append(codes[0, :, 0].tolist())
            run.distances.append(distances)
            run.text_tokens.append(int(tokens[0, 0, 0]))
    return run


def run_lm_on_codes(model: LoadedModel, codes: list[list[int]]) -> list[int]:
    """Text tokens of a batch-1 LMGen fed ``codes`` (already one step late)."""
    lm_gen = LMGen(model.lm, use_sampling=False, temp=0.0, temp_text=0.0)
    out = []
    with lm_gen.streaming(1), torch.no_grad(), models.compile_policy(model.device):
        for step_codes in codes:
            lm_input = torch.tensor(step_codes, device=model.device).view(1, -1, 1)
            tokens = lm_gen.step(lm_input)
            assert tokens is not None
            out.append(int(tokens[0, 0, 0]))
    return out


def quantize_with_distances(
    model: LoadedModel, latent: torch.Tensor
) -> tuple[torch.Tensor, list[NDArray[np.float32]]]:
    """Mimi's split residual quantizer, stage by stage, keeping each stage's distances."""
    quantizer: Any = model.mimi.quantizer
    codes: list[torch.Tensor] = []
    distances: list[NDArray[np.float32]] = []
    for rvq in (quantizer.rvq_first, quantizer.rvq_rest):
        residual = rvq.input_proj(latent)
        for layer in rvq.vq.layers[: rvq.n_q]:
            projected = layer.project_in(layer._rearrange_input(residual))
            flat = projected.reshape(-1, layer._codebook.dim)
            dist = torch.cdist(flat[None], layer._codebook.embedding[None], p=2)[0]
            code = dist.argmin(dim=-1).view(residual.shape[0], -1)
            residual = residual - layer.decode(code)
            codes.append(code)
            distances.append(dist[0].cpu().numpy())
    return torch.stack(codes, dim=1), distances


def is_near_tie(
    distances: NDArray[np.float32], code_a: int, code_b: int, rel_tol: float = 1e-4
) -> bool:
    """Whether two centroids are equally near within float rounding."""
    gap = abs(float(distances[code_a]) - float(distances[code_b]))
    return gap <= rel_tol * max(1.0, float(distances[code_b]))
