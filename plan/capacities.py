"""Slots per pod from a ``bench capacity`` result.

The fields read, and only these: ``"streams_per_gpu"`` (an int above zero, the real-time
streams one GPU keeps) and ``"model"`` (a string, the model measured). A pod of
``gpus_per_pod`` GPUs gets ``streams_per_gpu * gpus_per_pod`` slots. Without a file
named, the newest ``capacity-*.json`` (of ``--model`` when given) of the measurements
that ship with ``asrpool.bench`` (``bench/results/`` of a checkout; the GPU ones in the
wheel) is used, wherever the command runs.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
from pathlib import Path
from typing import Any

from asrpool.plan import scenarios

RESULTS = Path(str(importlib.resources.files("asrpool.bench") / "results"))
PATTERN = "capacity-*.json"


@dataclasses.dataclass(frozen=True)
class Capacity:
    streams_per_gpu: int
    model: str
    source: str


def read(path: Path) -> Capacity:
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise scenarios.PlanError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise scenarios.PlanError(f"{path} is not JSON: {exc}") from exc
    return _checked(raw, str(path))


def _checked(raw: Any, source: str) -> Capacity:
    if not isinstance(raw, dict):
        raise scenarios.PlanError(f"{source}: expected a JSON object with streams_per_gpu")
    streams, model = raw.get("streams_per_gpu"), raw.get("model")
    if streams == 0 and not isinstance(streams, bool):  # measured: not one in real time
        device = raw.get("device_name") or raw.get("device") or "its device"
        raise scenarios.PlanError(
            f"{source}: {model} kept no stream in real time on {device} (streams_per_gpu 0):"
            " nothing to plan with; measure it on a GPU (asrpool bench capacity), or give"
            " --slots-per-pod")
    if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
        raise scenarios.PlanError(
            f"{source}: streams_per_gpu must be an integer of at least 1, got {streams!r}")
    if not isinstance(model, str) or not model:
        raise scenarios.PlanError(f"{source}: model must be a non-empty string, got {model!r}")
    return Capacity(streams, model, source)


def newest(model: str | None, folder: Path = RESULTS) -> Capacity | None:
    """The newest result in ``folder`` (of ``model`` when given), or None. Results of
    other models are not checked: a CPU run that found no real-time stream (0) says
    nothing about the model asked for, and must not stop the plan."""
    for path in sorted(folder.glob(PATTERN), key=_mtime, reverse=True):
        if model is None or _model_of(path) == model:
            return read(path)
    return None


def _model_of(path: Path) -> object:
    """The model a result names, or None where it names none or is no JSON object (then
    it is checked, and refused, only if no model was asked for)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return raw.get("model") if isinstance(raw, dict) else None


def _mtime(path: Path) -> float:
    return path.stat().st_mtime
