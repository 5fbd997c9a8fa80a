"""Model loading: random presets built with moshi's own constructors, or real checkpoints.

``tiny`` and ``small`` are seeded random models for tests and CPU benchmarks;
``stt-1b-en_fr`` and ``stt-2.6b-en`` are Kyutai's real architectures with random
weights, for GPU throughput. Anything else is a checkpoint: a local directory in the
layout of Kyutai's Hugging Face repos (``config.json``, LM and Mimi safetensors,
SentencePiece tokenizer), or a Hugging Face repo id loaded through
:class:`moshi.models.loaders.CheckpointInfo`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sentencepiece
import torch
from moshi.models import loaders
from moshi.models.compression import MimiModel
from moshi.models.lm import LMModel
from moshi.utils import compile as moshi_compile

from asrpool.common import dtypes, protocol, weights
from asrpool.server import answers, codebooks, tokenizers

FRAME_RATE = protocol.FRAME_RATE


class ModelError(ValueError):
    """A model that cannot be built or loaded; the message says what is wrong."""


@dataclasses.dataclass
class LoadedModel:
    model_id: str
    mimi: MimiModel
    lm: LMModel
    tokenizer: sentencepiece.SentencePieceProcessor
    asr_delay_in_tokens: int

    @property
    def device(self) -> torch.device:
        return self.lm.device


@dataclasses.dataclass(frozen=True)
class Preset:
    """A random model: Mimi config, LM kwargs, delay and tokenizer size."""

    mimi_config: dict[str, Any]
    lm_kwargs: dict[str, Any]
    asr_delay_in_tokens: int
    vocab_size: int
    text_bias: bool  # tilt text logits towards padding so words end as in real output


def _tiny_mimi() -> dict[str, Any]:
    seanet = dict(loaders._seanet_kwargs, dimension=32, n_filters=4)
    transformer = dict(
        loaders._transformer_kwargs, d_model=32, num_heads=2, num_layers=1,
        dim_feedforward=64, context=50, input_dimension=32, output_dimensions=[32],
    )
    quantizer = dict(loaders._quantizer_kwargs, dimension=16, n_q=8, bins=64,
                     input_dimension=32, output_dimension=32)
    return dict(loaders._mimi_config, seanet=seanet, transformer=transformer,
                quantizer=quantizer)


def _lm_kwargs(n_q: int, card: int, text_card: int, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(
        n_q=n_q, dep_q=0, card=card, text_card=text_card, existing_text_padding_id=3,
        delays=[0] * (n_q + 1), causal=True, layer_scale=None, max_period=10000,
        gating="silu", norm="rms_norm_f32", positional_embedding="rope",
        extra_heads_dim=6,
        depformer_dim=16, depformer_num_heads=1, depformer_num_layers=1,
    )
    return base | overrides


def _preset(name: str, mimi_config: dict[str, Any], lm_kwargs: dict[str, Any],
            vocab_size: int, text_bias: bool) -> Preset:
    """A preset whose delay and extra heads are those ``answers`` gives its name (which
    the paced engine answers with, building no model)."""
    said = answers.PRESETS[name]
    return Preset(mimi_config, lm_kwargs | {"extra_heads_num_heads": said.extra_heads},
                  said.delay, vocab_size, text_bias)


# ``stt-1b-en_fr`` and ``stt-2.6b-en`` follow Kyutai's own moshi-server configurations
# (kyutai-labs/delayed-streams-modeling, configs/config-stt-en_fr-hf.toml and
# config-stt-en-hf.toml); tests/engine/test_presets.py holds every field to them. Their
# feed-forward is dim_feedforward = 8192, gated: moshi-core makes that 11 * 2048 / 4 =
# 5,632 wide, Python moshi 21 * 2048 / 8 = 5,376 (it reads 8192 as 4 * dim); a hidden
# scale of 4.125 (8,448, two thirds of which is 5,632) builds the released width.
PRESETS: dict[str, Preset] = {
    "tiny": _preset(
        "tiny", _tiny_mimi(),
        _lm_kwargs(8, 64, 256, dim=64, num_heads=4, num_layers=2, hidden_scale=2,
                   context=25),
        vocab_size=256, text_bias=True,
    ),
    "small": _preset(
        "small", loaders._mimi_config,
        _lm_kwargs(32, 2048, 256, dim=512, num_heads=8, num_layers=8, hidden_scale=4.125,
                   context=375),
        vocab_size=256, text_bias=True,
    ),
    "stt-1b-en_fr": _preset(
        "stt-1b-en_fr", loaders._mimi_config,
        _lm_kwargs(32, 2048, 8000, dim=2048, num_heads=16, num_layers=16, hidden_scale=4.125,
                   context=750, max_period=100000),
        vocab_size=256, text_bias=False,
    ),
    "stt-2.6b-en": _preset(
        "stt-2.6b-en", loaders._mimi_config,
        _lm_kwargs(32, 2048, 4000, dim=2048, num_heads=32, num_layers=48, hidden_scale=4.125,
                   context=375, max_period=100000),
        vocab_size=256, text_bias=False,
    ),
}


def default_dtype(device: str | torch.device) -> torch.dtype:
    """The one dtype policy: bfloat16 on CUDA, float32 elsewhere."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def resolve_dtype(choice: str, device: str | torch.device) -> torch.dtype:
    """``auto`` is :func:`default_dtype`; an explicit choice wins. ``serve`` (and so every
    pool's pods, whose ``spec.dtype`` arrives as ``ASRPOOL_DTYPE``), ``transcribe`` and the
    benchmarks all decide here."""
    if choice not in dtypes.DTYPES:
        raise ModelError(f"unknown dtype {choice!r}: expected one of {', '.join(dtypes.DTYPES)}")
    if choice == dtypes.AUTO:
        return default_dtype(device)
    dtype: torch.dtype = getattr(torch, choice)
    return dtype


@contextlib.contextmanager
def compile_policy(device: torch.device) -> Iterator[None]:
    """Let moshi torch.compile its kernels on CUDA only.

    On the CPU, inductor's C++ code generation fails for some of moshi's kernels with
    the torch build that moshi's pins select here, and compiling costs more than it saves.
    """
    if device.type == "cuda":
        yield
    else:
        with moshi_compile.no_compile():
            yield


def load_model(
    name: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    context: int | None = None,
    revision: str | None = None,
) -> LoadedModel:
    """Build a preset, or load a checkpoint directory or Hugging Face repo (at ``revision``)."""
    if name in PRESETS:
        return build_random(name, device, dtype, context)
    path = Path(name)
    if path.exists() or path.is_absolute():
        return load_checkpoint_dir(path, device, dtype, context)
    if _looks_like_repo_id(name):
        return load_hf_repo(name, device, dtype, context, revision)
    raise ModelError(
        f"unknown model {name!r}: expected one of {', '.join(PRESETS)}, "
        "a checkpoint directory, or a Hugging Face repo id (org/name)"
    )


def _looks_like_repo_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/"))


def build_random(
    name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
    context: int | None = None, seed: int = 42, preset: Preset | None = None,
) -> LoadedModel:
    """A seeded random preset (``preset`` instead of the one named, for a variant of a
    preset that is no preset itself); every process builds bit-identical weights."""
    preset = preset or PRESETS[name]
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        mimi = loaders.get_mimi(None, mimi_config=preset.mimi_config, device="cpu",
                                num_codebooks=preset.lm_kwargs["n_q"])
        codebooks.seed_codebooks(mimi, seed=seed)
        lm_kwargs = dict(preset.lm_kwargs)
        if context is not None:
            lm_kwargs["context"] = context
        lm = loaders.get_moshi_lm(None, lm_kwargs=lm_kwargs, device="cpu", dtype=torch.float32)
        if preset.text_bias:
            _tilt_towards_padding(lm)
    finally:
        torch.random.set_rng_state(generator_state)
    return LoadedModel(
        model_id=name,
        mimi=mimi.to(device),
        lm=lm.to(device=device, dtype=dtype),
        tokenizer=tokenizers.train_tokenizer(preset.vocab_size),
        asr_delay_in_tokens=preset.asr_delay_in_tokens,
    )


# How much more weight the padding (3) and end-of-padding (0) rows of a random text
# head get (text_bias presets).
PADDING_TILT, END_OF_PADDING_TILT = 5.0, 2.5


def _tilt_towards_padding(lm: LMModel) -> None:
    """Give the padding (3) and end-of-padding (0) rows of the text head more weight.

    A random LM picks among its whole vocabulary; real STT output is mostly padding
    with a word every few steps. The tilt keeps the choice input-dependent.
    """
    with torch.no_grad():
        weight = lm.text_linear.weight
        weight[3] *= PADDING_TILT
        weight[0] *= END_OF_PADDING_TILT


def load_checkpoint_dir(
    path: Path, device: str | torch.device, dtype: torch.dtype, context: int | None
) -> LoadedModel:
    config_path = path / weights.CONFIG_NAME
    if not path.is_dir():
        raise ModelError(f"checkpoint directory {path} does not exist (or is not a directory)")
    if not config_path.is_file():
        raise ModelError(f"checkpoint directory {path} is missing {weights.CONFIG_NAME}")
    config = _read_json(config_path)
    names = weights.checkpoint_files(config)
    missing = [name for name in names if not (path / name).is_file()]
    if missing:
        raise ModelError(f"checkpoint directory {path} is missing {', '.join(missing)}")
    mimi_config = config.get("mimi_config_name")
    info = loaders.CheckpointInfo.from_hf_repo(
        str(path),
        moshi_weights=path / names[0], mimi_weights=path / names[1], tokenizer=path / names[2],
        config_path=config_path,
        mimi_config_path=(path / mimi_config) if mimi_config else None,
    )
    return _from_checkpoint_info(info, str(path), device, dtype, context)


def load_hf_repo(
    repo: str, device: str | torch.device, dtype: torch.dtype, context: int | None,
    revision: str | None = None,
) -> LoadedModel:
    try:
        info = loaders.CheckpointInfo.from_hf_repo(repo, revision=revision)
    except Exception as exc:  # hub errors come in many types (offline, 404, auth)
        raise ModelError(f"cannot fetch model {repo!r} from Hugging Face: {exc}") from exc
    return _from_checkpoint_info(info, repo, device, dtype, context)


def _from_checkpoint_info(
    info: loaders.CheckpointInfo, model_id: str, device: str | torch.device,
    dtype: torch.dtype, context: int | None,
) -> LoadedModel:
    overrides = {} if context is None else {"context": context}
    lm = loaders.get_moshi_lm(info.moshi_weights, lm_kwargs=info.lm_config, device=device,
                              dtype=dtype, lm_kwargs_overrides=overrides)
    if lm.dep_q != 0:
        raise ModelError(f"{model_id} is not a speech-to-text model (dep_q={lm.dep_q})")
    if lm.condition_provider is not None and lm.condition_provider.conditioners:
        raise ModelError(f"{model_id} needs conditioning, which asrpool does not support yet")
    mimi = info.get_mimi(device=device)
    mimi.set_num_codebooks(lm.num_audio_codebooks)
    return LoadedModel(
        model_id=model_id,
        mimi=mimi,
        lm=lm,
        tokenizer=info.get_text_tokenizer(),
        asr_delay_in_tokens=asr_delay_from_config(info.raw_config or {}, model_id),
    )


# Kyutai's server configurations set these delays (those of the presets of the repos'
# architectures); the repos' config.json only give seconds (2.5 s is 31.25 steps), and
# Kyutai's configuration for the 2.6B model says 32.
KYUTAI_SERVER_DELAYS = {repo: answers.PRESETS[preset].delay
                        for repo, preset in answers.KYUTAI_REPOS.items()}


def asr_delay_from_config(config: dict[str, Any], model_id: str = "") -> int:
    """Steps between audio and its words.

    An explicit ``asr_delay_in_tokens`` in the checkpoint wins; then the delay Kyutai's
    own server uses for one of its repos; then ``stt_config.audio_delay_seconds``.
    """
    if "asr_delay_in_tokens" in config:
        return int(config["asr_delay_in_tokens"])
    if model_id in KYUTAI_SERVER_DELAYS:
        return KYUTAI_SERVER_DELAYS[model_id]
    delay_seconds = float(config.get("stt_config", {}).get("audio_delay_seconds", 0.5))
    return int(delay_seconds * FRAME_RATE)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelError(f"{path} must hold a JSON object")
    return data


def save_checkpoint_dir(model: LoadedModel, path: Path, mimi_config: dict[str, Any],
                        lm_config: dict[str, Any]) -> None:
    """Write ``model`` in the layout of Kyutai's repos (used to test the real path)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.lm.state_dict().items()},
              str(path / "model.safetensors"))
    save_file({k: v.contiguous() for k, v in model.mimi.state_dict().items()},
              str(path / "mimi.safetensors"))
    (path / "tokenizer.model").write_bytes(model.tokenizer.serialized_model_proto())
    (path / "mimi_config.json").write_text(json.dumps(mimi_config))
    config = dict(lm_config, moshi_name="model.safetensors", mimi_name="mimi.safetensors",
                  tokenizer_name="tokenizer.model", mimi_config_name="mimi_config.json",
                  model_type="stt", stt_config={"audio_delay_seconds":
                                                model.asr_delay_in_tokens / FRAME_RATE})
    (path / "config.json").write_text(json.dumps(config, indent=2))
