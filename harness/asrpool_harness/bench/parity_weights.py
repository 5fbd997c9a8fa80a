"""One random checkpoint in both weight-name layouts: asrpool's and moshi-server's.

asrpool loads Kyutai's repo layout through Python moshi (0.2.13), whose attention
layers save their projections as ``in_projs.0.weight`` / ``out_projs.0.weight`` (one
set of weights per layer, ``weights_per_step`` off). moshi-core, the model code of
Kyutai's Rust moshi-server, reads the older names ``in_proj_weight`` /
``out_proj.weight``, as the released checkpoints hold them (Python moshi renames them
on load, ``StreamingMultiheadAttention._load_hook``). Every other name is the same in
both. The moshi-core copy is converted from the asrpool files as written, so both
servers load the very same tensors.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from asrpool.common import weights
from asrpool.server import models

# (Python moshi's suffix, moshi-core's), for every attention projection.
RENAMES = (
    (".in_projs.0.weight", ".in_proj_weight"),
    (".in_projs.0.bias", ".in_proj_bias"),
    (".out_projs.0.weight", ".out_proj.weight"),
    (".out_projs.0.bias", ".out_proj.bias"),
)
# Per-step attention weights (``in_projs.1`` and up) have no moshi-core name.
_PER_STEP = (".in_projs.", ".out_projs.")
LM_FILE, MIMI_FILE, TOKENIZER_FILE = "model.safetensors", "mimi.safetensors", "tokenizer.model"


class LayoutError(ValueError):
    """A weight with no name in the other layout."""


def moshi_core_name(name: str) -> str:
    """``name`` (Python moshi 0.2.13) as moshi-core reads it."""
    for python_suffix, core_suffix in RENAMES:
        if name.endswith(python_suffix):
            return name[: -len(python_suffix)] + core_suffix
    if any(part in name for part in _PER_STEP):
        raise LayoutError(f"{name}: per-step attention weights have no moshi-core name")
    return name


def python_name(name: str) -> str:
    """``name`` (moshi-core) as Python moshi 0.2.13 saves it."""
    for python_suffix, core_suffix in RENAMES:
        if name.endswith(core_suffix):
            return name[: -len(core_suffix)] + python_suffix
    return name


def to_moshi_core(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    renamed = {moshi_core_name(name): tensor for name, tensor in state.items()}
    if len(renamed) != len(state):
        raise LayoutError("two weights share one moshi-core name")
    return renamed


@dataclasses.dataclass(frozen=True)
class SharedCheckpoint:
    """Where each server finds the same weights."""

    asrpool: Path  # a checkpoint directory: ``asrpool serve --model DIR``
    moshi_core: Path  # LM, Mimi and tokenizer files for moshi-server's configuration
    preset: models.Preset
    asr_delay_in_tokens: int

    @property
    def lm_file(self) -> Path:
        return self.moshi_core / LM_FILE

    @property
    def mimi_file(self) -> Path:
        return self.moshi_core / MIMI_FILE

    @property
    def tokenizer_file(self) -> Path:
        return self.moshi_core / TOKENIZER_FILE


# The parity model's text head leans towards padding (3) and end of padding (0) by these
# factors of the untilted random head, not the preset's (5 and 2.5): with the preset's,
# the random LM falls silent for good once it has seen a second of silence (every
# transcript of Kyutai's file client, which sends one first, would be empty); with
# these, words and EndWords keep coming, so every step's token is compared.
PADDING_TILT, END_OF_PADDING_TILT = 2.0, 4.0


def retilt(model: models.LoadedModel) -> None:
    """Give the preset's text head the parity model's tilt (see PADDING_TILT)."""
    with torch.no_grad():
        weight = model.lm.text_linear.weight
        weight[3] *= PADDING_TILT / models.PADDING_TILT
        weight[0] *= END_OF_PADDING_TILT / models.END_OF_PADDING_TILT


# The parity model's LM reads Mimi's first 4 codebooks. moshi-server's Mimi (candle) and
# Python moshi's (torch) round differently, and the deep residual stages of a random
# Mimi are near ties: from the 7th codebook on the two differ at almost every step
# (measured on `small`: the first 6 agree at every step after the first, 25 or 26 of 32
# differ), so an LM reading all 32 gets other inputs on the two servers from the first
# step on, and no transcript could agree. Read from the first 4, they are the same.
PARITY_CODEBOOKS = 4


def parity_preset(preset_name: str) -> models.Preset:
    """``preset_name`` with an LM over the first PARITY_CODEBOOKS codebooks."""
    preset = models.PRESETS[preset_name]
    n_q = min(PARITY_CODEBOOKS, preset.lm_kwargs["n_q"])
    lm_kwargs = preset.lm_kwargs | {"n_q": n_q, "delays": [0] * (n_q + 1)}
    return dataclasses.replace(preset, lm_kwargs=lm_kwargs)


def write_shared_checkpoint(preset_name: str, directory: Path) -> SharedCheckpoint:
    """Build the seeded random parity model of ``preset_name`` (:func:`parity_preset`,
    its text head retilted) and write it in both layouts under ``directory``
    (``asrpool/`` and ``moshi-core/``)."""
    preset = parity_preset(preset_name)
    model = models.build_random(preset_name, preset=preset)
    if preset.text_bias:
        retilt(model)
    shared = SharedCheckpoint(directory / "asrpool", directory / "moshi-core", preset,
                              model.asr_delay_in_tokens)
    models.save_checkpoint_dir(model, shared.asrpool, preset.mimi_config, preset.lm_kwargs)
    convert_checkpoint(shared.asrpool, shared.moshi_core)
    return shared


def convert_checkpoint(source: Path, target: Path) -> None:
    """The LM and Mimi files of the checkpoint directory ``source`` renamed for
    moshi-core, and its tokenizer, into ``target``."""
    lm_name, mimi_name, tokenizer_name = weights.checkpoint_files(_config(source))[:3]
    target.mkdir(parents=True, exist_ok=True)
    for name, out in ((lm_name, LM_FILE), (mimi_name, MIMI_FILE)):
        save_file(to_moshi_core(load_file(str(source / name))), str(target / out))
    shutil.copyfile(source / tokenizer_name, target / TOKENIZER_FILE)


def _config(checkpoint: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((checkpoint / weights.CONFIG_NAME).read_text())
    return config
