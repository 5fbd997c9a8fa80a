"""What the benches share about devices and bad input: one checked device, one error,
one way to load a model there."""

from __future__ import annotations

import torch

from asrpool.server import models


class BadInput(Exception):
    """Bad input to a bench: printed on one line, and the command exits 2."""


def resolve(name: str) -> torch.device:
    """``cpu`` or ``cuda[:N]``; CUDA only where torch sees a device."""
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise BadInput(f"unknown device {name!r}: {first_line(exc)}") from exc
    if device.type not in ("cpu", "cuda"):
        raise BadInput(f"unsupported device {name!r}: use cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BadInput(f"--device {name} but torch sees no CUDA device "
                       f"(torch {torch.__version__}, CUDA build {torch.version.cuda})")
    return device


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def load_model(name: str, device: torch.device, context: int | None = None) -> models.LoadedModel:
    """``name`` on ``device`` in the one dtype policy (models.default_dtype); a name that
    is no preset, checkpoint or repo is bad input."""
    try:
        return models.load_model(name, device=device, dtype=models.default_dtype(device),
                                 context=context)
    except models.ModelError as exc:
        raise BadInput(str(exc)) from exc
