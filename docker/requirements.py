"""Print the pinned requirements of an image, read from pyproject.toml (one source of pins).

    python docker/requirements.py control pyproject.toml   # everything but the model stack
    python docker/requirements.py server pyproject.toml    # everything

The control image (operator and router) leaves out the model stack: ``router`` and
``operator`` never import torch or moshi (docs/architecture.md), and a test proves they
import without it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

# Distributions only the server's engine needs (and their import names, for the test).
MODEL_STACK = {
    "torch": "torch",
    "moshi": "moshi",
    "sphn": "sphn",
    "sentencepiece": "sentencepiece",
    "safetensors": "safetensors",
    "huggingface-hub": "huggingface_hub",
}


def distribution(requirement: str) -> str:
    """The normalised distribution name of a requirement such as ``uvicorn[standard]==0.54``."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(image: str, pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    pins: list[str] = list(project["dependencies"])
    if image == "server":
        return pins
    if image == "control":
        return [pin for pin in pins if distribution(pin) not in MODEL_STACK]
    raise ValueError(f"unknown image {image!r}: control or server")


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1], Path(sys.argv[2]))))
