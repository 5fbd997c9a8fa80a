"""Print the pinned requirements of an image, read from pyproject.toml (one source of pins),
or the server image's install split into layers, read from pip's install report.

    python docker/requirements.py control pyproject.toml   # everything but the model stack
    python docker/requirements.py server pyproject.toml    # everything
    python docker/requirements.py layers report.json       # one line of pins per layer

The control image (operator and router) leaves out the model stack: ``router`` and
``operator`` never import torch or moshi (docs/architecture.md), and a test proves they
import without it.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


# The server's 7.8 GB of packages in layers of at most about 2.7 GB each: committing a layer
# takes twice its size in temporary files (buildah and containers/image each keep a copy
# until it is stored), so one layer of everything needed some 20 GB free beside the image.
# Each entry: what it holds (with its size for torch 2.9.1), and the distributions in it.
LAYERS: list[tuple[str, Callable[[str], bool]]] = [
    ("cuDNN and cuBLAS, 1.95 GB", lambda name: name in {"nvidia-cudnn-cu12", "nvidia-cublas-cu12"}),
    ("the other CUDA libraries, 2.65 GB", lambda name: name.startswith("nvidia-")),
    ("torch and triton, 2.4 GB", lambda name: name in {"torch", "triton"}),
]


def layer_of(name: str) -> int | None:
    """The first entry of LAYERS that holds a distribution; None: the last, common layer."""
    return next((index for index, (_, holds) in enumerate(LAYERS) if holds(name)), None)


def layers(report: dict[str, Any]) -> list[str]:
    """One line of ``name==version`` pins per entry of LAYERS, from ``pip install --dry-run
    --report``'s JSON; the rest (0.6 GB) is left to the install of the requirements."""
    lines: list[list[str]] = [[] for _ in LAYERS]
    for item in report["install"]:
        name = distribution(item["metadata"]["name"])
        index = layer_of(name)
        if index is not None:
            lines[index].append(f"{name}=={item['metadata']['version']}")
    return [" ".join(sorted(line)) for line in lines]


def main(arguments: list[str]) -> str:
    what, path = arguments
    if what == "layers":
        return "\n".join(layers(json.loads(Path(path).read_text())))
    return "\n".join(requirements(what, Path(path)))


if __name__ == "__main__":
    print(main(sys.argv[1:]))
