"""Model presets, the real checkpoint path, and clear errors for bad models."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from moshi.models import loaders

from asrpool.common import weights
from asrpool.server import engine, models
from tests.support import streams

FINGERPRINT = """
import hashlib, sys
from asrpool.server import models
m = models.load_model("tiny")
h = hashlib.sha256(m.tokenizer.serialized_model_proto())
for module in (m.mimi, m.lm):
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode()); h.update(tensor.detach().cpu().numpy().tobytes())
print(h.hexdigest())
"""


def _fingerprint_in_subprocess() -> str:
    out = subprocess.run([sys.executable, "-c", FINGERPRINT], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def test_tiny_is_identical_in_every_process() -> None:
    assert _fingerprint_in_subprocess() == _fingerprint_in_subprocess()


def test_tiny_quantizer_codebooks_are_seeded(tiny: models.LoadedModel) -> None:
    layers = [*tiny.mimi.quantizer.rvq_first.vq.layers, *tiny.mimi.quantizer.rvq_rest.vq.layers]
    for layer in layers:
        embedding = layer._codebook.embedding
        assert embedding.abs().sum() > 0
        assert len(torch.unique(embedding, dim=0)) == len(embedding)


def _tokens(model: models.LoadedModel, frames: list[np.ndarray]) -> list[int]:
    with engine.BatchedEngine(model, 2) as eng:
        eng.reset_slot(1)
        return [eng.step({1: frame}).text_tokens[1] for frame in frames]


def _save(tmp_path: Path) -> tuple[models.LoadedModel, Path]:
    preset = models.PRESETS["tiny"]
    model = models.build_random("tiny")
    models.save_checkpoint_dir(model, tmp_path / "ckpt", preset.mimi_config, preset.lm_kwargs)
    return model, tmp_path / "ckpt"


def test_saved_checkpoint_loads_through_the_real_path(tmp_path: Path) -> None:
    original, path = _save(tmp_path)
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json", "mimi.safetensors", "mimi_config.json", "model.safetensors",
        "tokenizer.model"]
    loaded = models.load_model(str(path))
    assert loaded.asr_delay_in_tokens == original.asr_delay_in_tokens
    assert loaded.model_id == str(path)
    frames = streams.frames_of(streams.random_speechlike(3.0, seed=5))
    assert _tokens(loaded, frames) == _tokens(original, frames)


def test_checkpoint_with_a_missing_file_is_refused(tmp_path: Path) -> None:
    _, path = _save(tmp_path)
    (path / "mimi.safetensors").unlink()
    with pytest.raises(models.ModelError, match=r"missing mimi\.safetensors"):
        models.load_model(str(path))


def test_checkpoint_without_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(models.ModelError, match=r"is missing config\.json"):
        models.load_model(str(tmp_path / "empty"))


def test_checkpoint_with_broken_config_is_refused(tmp_path: Path) -> None:
    _, path = _save(tmp_path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(models.ModelError, match="not valid JSON"):
        models.load_model(str(path))


def test_unknown_model_name_says_what_is_accepted() -> None:
    with pytest.raises(models.ModelError, match=r"unknown model 'large-ish'.*tiny, small"):
        models.load_model("large-ish")


def test_unreachable_hub_repo_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # No network here either way; offline mode makes the hub client fail at once.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(models.ModelError, match="cannot fetch model 'kyutai/no-such-stt'"):
        models.load_model("kyutai/no-such-stt")


def test_asr_delay_comes_from_the_stt_config() -> None:
    assert models.asr_delay_from_config({"stt_config": {"audio_delay_seconds": 0.5}}) == 6
    assert models.asr_delay_from_config({"stt_config": {"audio_delay_seconds": 2.5}}) == 31
    assert models.asr_delay_from_config({"asr_delay_in_tokens": 9}) == 9


def test_context_override_sets_the_rolling_cache() -> None:
    assert models.load_model("tiny", context=8).lm.context == 8


def test_tokenizer_keeps_kyutai_special_ids(tiny: models.LoadedModel) -> None:
    assert tiny.tokenizer.id_to_piece(3) == "<pad>"
    assert tiny.tokenizer.unk_id() == 0
    digest = hashlib.sha256(tiny.tokenizer.serialized_model_proto()).hexdigest()
    assert digest == hashlib.sha256(models.build_random("tiny").tokenizer
                                    .serialized_model_proto()).hexdigest()


def test_checkpoint_config_records_the_layout(tmp_path: Path) -> None:
    _, path = _save(tmp_path)
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "stt"
    assert config["dep_q"] == 0


def test_the_presets_are_the_ones_the_operator_accepts() -> None:
    assert tuple(models.PRESETS) == weights.PRESET_NAMES


def test_the_default_file_names_are_moshis() -> None:
    assert (weights.DEFAULT_MOSHI_NAME, weights.DEFAULT_MIMI_NAME,
            weights.DEFAULT_TOKENIZER_NAME) == (loaders.MOSHI_NAME, loaders.MIMI_NAME,
                                                loaders.TEXT_TOKENIZER_NAME)


@pytest.mark.parametrize(("choice", "device", "expected"), [
    ("auto", "cpu", torch.float32), ("auto", "cuda", torch.bfloat16),
    ("float32", "cuda", torch.float32), ("float16", "cpu", torch.float16),
    ("bfloat16", "cpu", torch.bfloat16)])
def test_one_dtype_policy_where_an_explicit_choice_wins(choice: str, device: str,
                                                        expected: torch.dtype) -> None:
    assert models.resolve_dtype(choice, device) == expected


def test_an_unknown_dtype_is_refused_by_name() -> None:
    with pytest.raises(models.ModelError, match="unknown dtype 'int8'"):
        models.resolve_dtype("int8", "cpu")
