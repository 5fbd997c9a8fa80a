"""What every benchmark's JSON says of its machine, and how it is written."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any


def machine(started: float) -> dict[str, Any]:
    """The machine's cores, its load at the end and the seconds since ``started``
    (``time.monotonic``): what tells a noisy run from a quiet one."""
    return {"cpus": os.cpu_count(), "load_average_at_end": os.getloadavg(),
            "elapsed_s": round(time.monotonic() - started, 1)}


def wake_cost_us(sleeps: int = 400, seconds: float = 5e-4) -> float:
    """CPU a thread spends per short sleep (``time.thread_time``), median of three runs:
    what each wake-up of an event loop that ran dry costs on this machine, the kernel's
    part included. Beside a pod's CPU per frame it tells a slow machine from a slow pod:
    a loop at light load pays about one wake-up per message."""
    runs = []
    for _ in range(3):
        started = time.thread_time()
        for _ in range(sleeps):
            time.sleep(seconds)
        runs.append((time.thread_time() - started) / sleeps)
    return round(statistics.median(runs) * 1e6, 2)


def write(out: Path, name: str, result: dict[str, Any]) -> Path:
    """``result`` as ``out/name`` (indented JSON), said on standard output."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return path
