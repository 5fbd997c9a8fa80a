"""Where a pod's model comes from: the contract the operator, the server and
``asrpool fetch-model`` share (no torch, no moshi, no network here).

A model reference is a preset (random weights), a Hugging Face repo id (``org/name``)
or an absolute path to a checkpoint directory in Kyutai's repo layout. The exit codes
say why a pod's model could not be had, so that the operator can put the reason in
the pool's status without reading logs: the kubelet keeps a container's exit code.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Any

# The random presets of ``asrpool.server.models.PRESETS`` (a test holds them equal).
PRESET_NAMES = ("tiny", "small", "stt-1b-en_fr", "stt-2.6b-en")

# File names moshi assumes when a repo's config.json names none
# (``moshi.models.loaders``; a test holds them equal).
DEFAULT_MOSHI_NAME = "model.safetensors"
DEFAULT_MIMI_NAME = "tokenizer-e351c8d8-checkpoint125.safetensors"
DEFAULT_TOKENIZER_NAME = "tokenizer_spm_32k_3.model"
CONFIG_NAME = "config.json"

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")

# Exit codes of ``asrpool serve`` and ``asrpool fetch-model`` (1 stays "anything else").
EXIT_MODEL_UNAVAILABLE = 3  # no such repo, revision or file; token refused; files missing
EXIT_REGISTRY_UNAVAILABLE = 4  # the Hugging Face Hub cannot be reached (or fails, 5xx)
EXIT_CACHE_UNAVAILABLE = 5  # the cache cannot be written (full, read-only, permissions)

# The pool status reason for each of them.
EXIT_REASONS = {
    EXIT_MODEL_UNAVAILABLE: "ModelUnavailable",
    EXIT_REGISTRY_UNAVAILABLE: "RegistryUnavailable",
    EXIT_CACHE_UNAVAILABLE: "ModelCacheUnavailable",
}


class Kind(enum.Enum):
    PRESET = "preset"
    REPO = "repo"
    PATH = "path"


def kind_of(reference: str) -> Kind | None:
    """What a model reference names, or None when it is none of the three."""
    if reference in PRESET_NAMES:
        return Kind.PRESET
    if reference.startswith("/"):
        return Kind.PATH
    if _REPO_ID.match(reference) and ".." not in reference:
        return Kind.REPO
    return None


def describe_kinds() -> str:
    return (f"a preset ({', '.join(PRESET_NAMES)}), a Hugging Face repo id (org/name) or an"
            " absolute path to a checkpoint directory")


def checkpoint_files(config: Mapping[str, Any]) -> list[str]:
    """The files a checkpoint's ``config.json`` needs beside it, as moshi reads them
    (``hf://org/repo/file`` for a file of another repo)."""
    names = [str(config.get("moshi_name", DEFAULT_MOSHI_NAME)),
             str(config.get("mimi_name", DEFAULT_MIMI_NAME)),
             str(config.get("tokenizer_name", DEFAULT_TOKENIZER_NAME))]
    names += [str(config[key]) for key in ("mimi_config_name", "lora_name") if config.get(key)]
    return names
