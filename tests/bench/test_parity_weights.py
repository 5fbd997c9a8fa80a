"""The shared checkpoint: both weight-name layouts hold the same tensors, and Python
moshi loads the moshi-core layout into the very model it came from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from asrpool.server import models
from asrpool_harness.bench import parity_weights


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> parity_weights.SharedCheckpoint:
    return parity_weights.write_shared_checkpoint("tiny", tmp_path_factory.mktemp("ckpt"))


def test_attention_projections_take_moshi_cores_names() -> None:
    prefix = "transformer.layers.0.self_attn"
    assert parity_weights.moshi_core_name(f"{prefix}.in_projs.0.weight") == \
        f"{prefix}.in_proj_weight"
    assert parity_weights.moshi_core_name(f"{prefix}.out_projs.0.weight") == \
        f"{prefix}.out_proj.weight"
    assert parity_weights.moshi_core_name("text_emb.weight") == "text_emb.weight"
    for name in (f"{prefix}.in_projs.0.weight", f"{prefix}.out_projs.0.bias", "emb.3.weight"):
        assert parity_weights.python_name(parity_weights.moshi_core_name(name)) == name


def test_per_step_weights_have_no_moshi_core_name() -> None:
    with pytest.raises(parity_weights.LayoutError, match="per-step"):
        parity_weights.moshi_core_name("transformer.layers.0.self_attn.in_projs.1.weight")


@pytest.mark.parametrize("name", [parity_weights.LM_FILE, parity_weights.MIMI_FILE])
def test_both_layouts_hold_the_same_tensors(shared: parity_weights.SharedCheckpoint,
                                            name: str) -> None:
    python = load_file(str(shared.asrpool / name))
    core = load_file(str(shared.moshi_core / name))
    assert sorted(core) == sorted(parity_weights.moshi_core_name(n) for n in python)
    assert not [n for n in core if ".in_projs." in n or ".out_projs." in n]
    assert [n for n in core if n.endswith(".in_proj_weight")], "no attention renamed"
    for core_name, tensor in core.items():
        assert torch.equal(tensor, python[parity_weights.python_name(core_name)]), core_name


def test_python_moshi_loads_the_moshi_core_layout_as_the_same_model(
        shared: parity_weights.SharedCheckpoint) -> None:
    """moshi's own load hook renames in_proj_weight back: the LM and Mimi loaded from
    moshi-core's files equal the checkpoint asrpool serves."""
    served = models.load_model(str(shared.asrpool))
    for module, name in ((served.lm, parity_weights.LM_FILE),
                         (served.mimi, parity_weights.MIMI_FILE)):
        before = {k: v.clone() for k, v in module.state_dict().items()}
        with torch.no_grad():
            for tensor in module.state_dict().values():
                tensor.zero_()
        module.load_state_dict(load_file(str(shared.moshi_core / name)), strict=True)
        after = module.state_dict()
        assert all(torch.equal(after[k], v) for k, v in before.items())


def test_the_parity_model_reads_the_first_codebooks_and_leans_less_towards_padding(
        shared: parity_weights.SharedCheckpoint) -> None:
    assert shared.preset.lm_kwargs["n_q"] == parity_weights.PARITY_CODEBOOKS
    assert len(shared.preset.lm_kwargs["delays"]) == parity_weights.PARITY_CODEBOOKS + 1
    assert models.load_model(str(shared.asrpool)).lm.num_audio_codebooks == \
        parity_weights.PARITY_CODEBOOKS
    preset = models.build_random("tiny", preset=shared.preset).lm.text_linear.weight
    saved = load_file(str(shared.asrpool / parity_weights.LM_FILE))["text_linear.weight"]
    ratio = parity_weights.PADDING_TILT / models.PADDING_TILT
    assert torch.allclose(saved[3], preset[3] * ratio)
    assert torch.equal(saved[5], preset[5])
    assert Path(shared.tokenizer_file).read_bytes() == \
        (shared.asrpool / parity_weights.TOKENIZER_FILE).read_bytes()
