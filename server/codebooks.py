"""Seed a random Mimi's quantizer codebooks from its own encoder's outputs.

A freshly built Mimi quantizer has all-zero codebooks: every input maps to the same
codes, and any "batched equals alone" check passes without proving anything. Here
each residual stage gets centroids drawn from the residuals it will really see, on
seeded random audio, so codes vary across streams and over time.
"""

from __future__ import annotations

from typing import Any

import torch
from moshi.models.compression import MimiModel

SEED_SECONDS = 8.0
SEED_STREAMS = 4


def seed_codebooks(mimi: MimiModel, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        latent = mimi._encode_to_unquantized_latent(_seed_audio(mimi, generator))
        quantizer: Any = mimi.quantizer
        for rvq in (quantizer.rvq_first, quantizer.rvq_rest):
            _seed_rvq(rvq, latent, generator)


def _seed_audio(mimi: MimiModel, generator: torch.Generator) -> torch.Tensor:
    """Noise with slowly varying loudness and a few tones: latents that vary."""
    length = int(SEED_SECONDS * mimi.sample_rate) // mimi.frame_size * mimi.frame_size
    t = torch.arange(length) / mimi.sample_rate
    noise = torch.randn(SEED_STREAMS, 1, length, generator=generator)
    freqs = 100 + 900 * torch.rand(SEED_STREAMS, 1, 1, generator=generator)
    envelope = 0.5 + 0.5 * torch.sin(2 * torch.pi * 0.7 * t + torch.rand(1, generator=generator))
    return 0.1 * envelope * (noise + torch.sin(2 * torch.pi * freqs * t))


def _seed_rvq(rvq: Any, latent: torch.Tensor, generator: torch.Generator) -> None:
    residual = rvq.input_proj(latent)
    for layer in rvq.vq.layers:
        projected = layer.project_in(layer._rearrange_input(residual))
        samples = projected.reshape(-1, layer._codebook.dim)
        _set_codebook(layer._codebook, samples, generator)
        residual = residual - layer.decode(layer.encode(residual))


def _set_codebook(codebook: Any, samples: torch.Tensor,
                  generator: torch.Generator) -> None:
    picks = torch.randint(len(samples), (codebook.codebook_size,), generator=generator)
    jitter = 0.05 * samples.std() * torch.randn(
        codebook.codebook_size, samples.shape[1], generator=generator)
    codebook.embedding_sum.copy_(samples[picks] + jitter)
    codebook.cluster_usage.fill_(1.0)
    codebook._initialized.fill_(1.0)
    codebook.register_buffer("_embedding", None, persistent=False)
