"""The real-architecture presets equal Kyutai's published configurations.

The numbers below are Kyutai's own moshi-server configurations for the two released
speech-to-text models (kyutai-labs/delayed-streams-modeling, ``configs/
config-stt-en_fr-hf.toml`` and ``configs/config-stt-en-hf.toml``), copied field by
field: ``[modules.asr.model]`` (vocabularies, codebooks), ``[modules.asr.model.
transformer]`` and ``[modules.asr.model.extra_heads]`` (absent for the 2.6B model),
and ``asr_delay_in_tokens``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from moshi.models.lm import LMModel

from asrpool.server import models

PUBLISHED: dict[str, dict[str, Any]] = {
    "stt-1b-en_fr": dict(
        audio_vocab_size=2049, text_in_vocab_size=8001, text_out_vocab_size=8000,
        audio_codebooks=32, d_model=2048, num_heads=16, num_layers=16,
        dim_feedforward=8192, context=750, max_period=100000, gating="silu",
        extra_heads_num_heads=4, extra_heads_dim=6, asr_delay_in_tokens=6,
    ),
    "stt-2.6b-en": dict(
        audio_vocab_size=2049, text_in_vocab_size=4001, text_out_vocab_size=4000,
        audio_codebooks=32, d_model=2048, num_heads=32, num_layers=48,
        dim_feedforward=8192, context=375, max_period=100000, gating="silu",
        extra_heads_num_heads=0, extra_heads_dim=None, asr_delay_in_tokens=32,
    ),
}


def moshi_core_gated_width(d_model: int, dim_feedforward: int) -> int:
    """The hidden width moshi-core (moshi-server's model code) gives a gated feed-forward."""
    return 11 * d_model // 4 if dim_feedforward == 4 * d_model else 2 * dim_feedforward // 3


def _built_gated_width(preset: models.Preset) -> int:
    kwargs = dict(preset.lm_kwargs)
    lm = LMModel(device=torch.device("meta"), **kwargs)
    out = dict(lm.named_modules())["transformer.layers.0.gating.linear_out"]
    assert isinstance(out, torch.nn.Linear)
    return out.in_features


def _as_published(preset: models.Preset) -> dict[str, Any]:
    """The preset's fields under the names of Kyutai's server configuration; the
    feed-forward by the width it builds (moshi and moshi-core read dim_feedforward apart)."""
    kw = preset.lm_kwargs
    extra_heads = kw["extra_heads_num_heads"]
    return dict(
        audio_vocab_size=kw["card"] + 1, text_in_vocab_size=kw["text_card"] + 1,
        text_out_vocab_size=kw["text_card"], audio_codebooks=kw["n_q"],
        d_model=kw["dim"], num_heads=kw["num_heads"], num_layers=kw["num_layers"],
        gated_width=_built_gated_width(preset), context=kw["context"],
        max_period=kw["max_period"], gating=kw["gating"],
        extra_heads_num_heads=extra_heads,
        extra_heads_dim=kw["extra_heads_dim"] if extra_heads else None,
        asr_delay_in_tokens=preset.asr_delay_in_tokens,
    )


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_equals_the_published_configuration(name: str) -> None:
    published = dict(PUBLISHED[name])
    published["gated_width"] = moshi_core_gated_width(published["d_model"],
                                                      published.pop("dim_feedforward"))
    assert _as_published(models.PRESETS[name]) == published


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_feed_forward_is_as_wide_as_moshi_cores(name: str) -> None:
    """Python moshi reads dim_feedforward 8192 (4 x 2048) as 5,376 wide, moshi-core as
    5,632: the preset builds the released checkpoints' 5,632 (it built 5,376, 5% fewer
    parameters, which flattered every capacity figure measured on it)."""
    published = PUBLISHED[name]
    expected = moshi_core_gated_width(published["d_model"], published["dim_feedforward"])
    assert expected == 5632
    assert _built_gated_width(models.PRESETS[name]) == expected


@pytest.mark.parametrize(("name", "billions"), [("stt-1b-en_fr", 1.0), ("stt-2.6b-en", 2.6)])
def test_preset_has_the_published_size(name: str, billions: float) -> None:
    """Built on the meta device (no memory): the parameter count is the model's name."""
    kwargs = dict(models.PRESETS[name].lm_kwargs)
    lm = LMModel(device=torch.device("meta"), **kwargs)
    count = sum(p.numel() for p in lm.parameters())
    assert abs(count / 1e9 - billions) / billions < 0.1, count


def test_explicit_checkpoint_delay_wins_over_seconds_and_kyutais_table() -> None:
    config = {"asr_delay_in_tokens": 30, "stt_config": {"audio_delay_seconds": 2.5}}
    assert models.asr_delay_from_config(config, "kyutai/stt-2.6b-en") == 30


def test_kyutais_repos_get_the_delay_of_kyutais_server() -> None:
    seconds_only = {"stt_config": {"audio_delay_seconds": 2.5}}
    assert models.asr_delay_from_config(seconds_only, "kyutai/stt-2.6b-en") == 32
    assert models.asr_delay_from_config(seconds_only, "someone/fine-tune") == 31
