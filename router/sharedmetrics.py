"""The folder where a router's worker processes keep their metrics (router.metrics).

prometheus_client picks its value store when it is imported: in memory, or in files of
the folder that ``PROMETHEUS_MULTIPROC_DIR`` names. So the router's command makes the
folder and names it before anything imports prometheus_client; this module imports
nothing of it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

ENV = "PROMETHEUS_MULTIPROC_DIR"


@contextlib.contextmanager
def folder_for(workers: int) -> Iterator[None]:
    """Several workers keep their metrics in one fresh folder, removed when the router
    exits; one worker keeps them in memory. A folder the environment already names is
    used as it is (and left)."""
    if workers == 1 or ENV in os.environ:
        yield
        return
    folder = tempfile.mkdtemp(prefix="asrpool-router-metrics-")
    os.environ[ENV] = folder
    try:
        yield
    finally:
        del os.environ[ENV]
        shutil.rmtree(folder, ignore_errors=True)
