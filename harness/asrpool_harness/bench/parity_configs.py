"""moshi-server's configuration for the shared checkpoint, as TOML.

The schema is moshi-server's ``Config`` (``static_dir``, ``log_dir``,
``instance_name``, ``authorized_ids``, ``[modules.NAME]``) with one ``BatchedAsr``
module: its files, ``asr_delay_in_tokens``, ``batch_size`` and ``[.model]``, moshi-core's
``lm::Config`` (vocabularies, codebooks, ``[.model.transformer]``,
``[.model.extra_heads]``). The LM fields come from the preset's Python moshi keyword
arguments: moshi-core must build the very layers Python moshi built (a feed-forward of
``int(hidden_scale * dim)``, which both read alike unless it is exactly ``4 * dim``).
Mimi has no section: moshi-server hard-codes Mimi ``v0_1`` with the LM's codebooks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from asrpool.common import protocol

MODULE = "asr"
# Python moshi's names of what moshi-core reads as an enum.
NORMS = {"rms_norm": "RmsNorm", "rms_norm_f32": "RmsNorm", "layer_norm": "LayerNorm"}
GATINGS = {"silu": "silu", "gelu": "gelu"}
POSITIONAL = {"rope": "Rope", "sin": "Sin", "none": "None"}
# moshi-core's rotary tables and rolling caches are sized for streams this long (steps);
# Kyutai's own configurations use the same.
MAX_SEQ_LEN = 40960


class ConfigError(ValueError):
    """A preset that moshi-core cannot build as Python moshi does."""


def transformer_section(lm_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``[modules.asr.model.transformer]`` from an LM's Python moshi keyword arguments."""
    _check_supported(lm_kwargs)
    dim = int(lm_kwargs["dim"])
    return {
        "d_model": dim,
        "num_heads": int(lm_kwargs["num_heads"]),
        "num_layers": int(lm_kwargs["num_layers"]),
        "dim_feedforward": int(lm_kwargs.get("hidden_scale", 4) * dim),
        "causal": bool(lm_kwargs.get("causal", True)),
        "norm_first": True,
        "bias_ff": False,
        "bias_attn": False,
        "context": int(lm_kwargs["context"]),
        "max_period": int(lm_kwargs.get("max_period", 10000)),
        "use_conv_block": False,
        "use_conv_bias": True,
        "gating": GATINGS[lm_kwargs["gating"]],
        "norm": NORMS[lm_kwargs["norm"]],
        "positional_embedding": POSITIONAL[lm_kwargs["positional_embedding"]],
        "conv_layout": False,
        "conv_kernel_size": 3,
        "kv_repeat": 1,
        "max_seq_len": MAX_SEQ_LEN,
    }


def _check_supported(lm_kwargs: Mapping[str, Any]) -> None:
    problems = []
    if lm_kwargs.get("dep_q", 0) != 0:
        problems.append("a depformer (dep_q > 0): not a speech-to-text model")
    if lm_kwargs.get("layer_scale") is not None:
        problems.append("layer_scale")
    if any(lm_kwargs.get("delays", [0])):
        problems.append("delayed codebooks")
    for key, names in (("norm", NORMS), ("gating", GATINGS),
                       ("positional_embedding", POSITIONAL)):
        if lm_kwargs.get(key) not in names:
            problems.append(f"{key}={lm_kwargs.get(key)!r}")
    if problems:
        raise ConfigError("moshi-server cannot build this LM as Python moshi does: "
                          + ", ".join(problems))


def model_section(lm_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``[modules.asr.model]``: moshi-core's ``lm::Config``."""
    text_card, card = int(lm_kwargs["text_card"]), int(lm_kwargs["card"])
    section: dict[str, Any] = {
        "audio_vocab_size": card + 1,  # the audio pad/initial token
        "text_in_vocab_size": text_card + 1,  # the text initial token
        "text_out_vocab_size": text_card,
        "audio_codebooks": int(lm_kwargs["n_q"]),
        "transformer": transformer_section(lm_kwargs),
    }
    heads = int(lm_kwargs.get("extra_heads_num_heads", 0))
    if heads:
        section["extra_heads"] = {"num_heads": heads, "dim": int(lm_kwargs["extra_heads_dim"])}
    return section


def moshi_server_config(*, lm_file: Path, mimi_file: Path, tokenizer_file: Path,
                        lm_kwargs: Mapping[str, Any], asr_delay_in_tokens: int,
                        batch_size: int, api_key: str, workdir: Path) -> dict[str, Any]:
    """The whole configuration: one batched ASR module at the protocol's path, greedy
    (temperature 0, as asrpool), behind one API key; logs and the (empty) static
    directory under ``workdir``."""
    module = {
        "type": "BatchedAsr",
        "path": protocol.STREAMING_PATH,
        "lm_model_file": str(lm_file),
        "text_tokenizer_file": str(tokenizer_file),
        "audio_tokenizer_file": str(mimi_file),
        "asr_delay_in_tokens": asr_delay_in_tokens,
        "batch_size": batch_size,
        "temperature": 0.0,
        "model": model_section(lm_kwargs),
    }
    return {
        "static_dir": str(workdir / "static"),
        "log_dir": str(workdir / "logs"),
        "instance_name": "parity",
        "authorized_ids": [api_key],
        "modules": {MODULE: module},
    }


def to_toml(config: Mapping[str, Any]) -> str:
    """``config`` as TOML: plain values first, then each table under its dotted header."""
    return "\n".join(_table_lines(config, ())) + "\n"


def _table_lines(table: Mapping[str, Any], path: tuple[str, ...]) -> list[str]:
    lines = [f"[{'.'.join(path)}]"] if path and _has_values(table) else []
    lines += [f"{key} = {_value(value)}" for key, value in table.items()
              if not isinstance(value, Mapping)]
    for key, value in table.items():
        if isinstance(value, Mapping):
            lines += _table_lines(value, (*path, key))
    return lines


def _has_values(table: Mapping[str, Any]) -> bool:
    return any(not isinstance(value, Mapping) for value in table.values())


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    raise ConfigError(f"no TOML value for {value!r}")
