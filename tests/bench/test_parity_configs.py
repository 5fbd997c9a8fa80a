"""moshi-server's configuration: the schema its ``Config`` reads, and an LM that
moshi-core builds exactly as Python moshi built the preset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomllib
import torch
from moshi.models.lm import LMModel

from asrpool.common import protocol
from asrpool.server import models
from asrpool_harness.bench import parity_configs


def _config(preset: str = "small", batch_size: int = 3) -> dict[str, Any]:
    root = Path("/ckpt")
    return parity_configs.moshi_server_config(
        lm_file=root / "model.safetensors", mimi_file=root / "mimi.safetensors",
        tokenizer_file=root / "tokenizer.model", lm_kwargs=models.PRESETS[preset].lm_kwargs,
        asr_delay_in_tokens=6, batch_size=batch_size, api_key='k"e\\y',
        workdir=Path("/work dir"))


def moshi_core_gated_width(d_model: int, dim_feedforward: int) -> int:
    """moshi-core's ``Mlp::new``: the hidden width of a gated feed-forward."""
    return 11 * d_model // 4 if dim_feedforward == 4 * d_model else 2 * dim_feedforward // 3


def test_the_toml_reads_back_as_the_configuration() -> None:
    config = _config()
    assert tomllib.loads(parity_configs.to_toml(config)) == config


def test_one_batched_asr_module_at_the_protocols_path() -> None:
    parsed = tomllib.loads(parity_configs.to_toml(_config()))
    assert sorted(parsed) == ["authorized_ids", "instance_name", "log_dir", "modules",
                              "static_dir"]
    assert parsed["authorized_ids"] == ['k"e\\y']
    module = parsed["modules"][parity_configs.MODULE]
    assert (module["type"], module["path"]) == ("BatchedAsr", protocol.STREAMING_PATH)
    assert (module["batch_size"], module["asr_delay_in_tokens"]) == (3, 6)
    assert module["temperature"] == 0.0
    assert module["lm_model_file"] == "/ckpt/model.safetensors"


@pytest.mark.parametrize("preset", ["tiny", "small", "stt-1b-en_fr", "stt-2.6b-en"])
def test_moshi_core_builds_the_layers_python_moshi_built(preset: str) -> None:
    kwargs = models.PRESETS[preset].lm_kwargs
    model = _config(preset)["modules"]["asr"]["model"]
    transformer = model["transformer"]
    lm = LMModel(device=torch.device("meta"), **kwargs)
    layers = dict(lm.named_modules())
    gated = layers["transformer.layers.0.gating.linear_out"]
    assert isinstance(gated, torch.nn.Linear)
    assert moshi_core_gated_width(transformer["d_model"], transformer["dim_feedforward"]) == \
        gated.in_features
    assert (model["audio_vocab_size"], model["text_in_vocab_size"]) == \
        (lm.card + 1, lm.text_card + 1)
    assert model["audio_codebooks"] == lm.num_audio_codebooks
    assert (transformer["num_layers"], transformer["num_heads"]) == \
        (kwargs["num_layers"], kwargs["num_heads"])
    heads = kwargs["extra_heads_num_heads"]
    assert model.get("extra_heads") == ({"num_heads": heads, "dim": kwargs["extra_heads_dim"]}
                                        if heads else None)


def test_small_uses_moshi_cores_enums() -> None:
    transformer = _config()["modules"]["asr"]["model"]["transformer"]
    assert (transformer["norm"], transformer["gating"], transformer["positional_embedding"]) \
        == ("RmsNorm", "silu", "Rope")


def test_an_lm_moshi_core_cannot_build_alike_is_refused() -> None:
    kwargs = dict(models.PRESETS["tiny"].lm_kwargs, dep_q=2, layer_scale=0.1)
    with pytest.raises(parity_configs.ConfigError, match=r"depformer.*layer_scale"):
        parity_configs.transformer_section(kwargs)


def test_a_value_with_no_toml_form_is_refused() -> None:
    with pytest.raises(parity_configs.ConfigError):
        parity_configs.to_toml({"x": None})
