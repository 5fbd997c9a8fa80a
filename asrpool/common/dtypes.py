"""The one dtype vocabulary: what a pool's ``spec.dtype``, ``--dtype`` and the
benchmarks accept. ``auto`` is the server's policy (server.models.default_dtype):
bfloat16 on CUDA, float32 elsewhere."""

from __future__ import annotations

import typing
from typing import Literal

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
DTYPES: tuple[str, ...] = typing.get_args(Dtype)
AUTO: Dtype = "auto"
