"""What every benchmark's JSON says of its machine, and how it is written."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def machine(started: float) -> dict[str, Any]:
    """The machine's cores, its load at the end and the seconds since ``started``
    (``time.monotonic``): what tells a noisy run from a quiet one."""
    return {"cpus": os.cpu_count(), "load_average_at_end": os.getloadavg(),
            "elapsed_s": round(time.monotonic() - started, 1)}


def write(out: Path, name: str, result: dict[str, Any]) -> Path:
    """``result`` as ``out/name`` (indented JSON), said on standard output."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return path
