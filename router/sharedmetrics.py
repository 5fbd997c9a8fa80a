"""The folder where a router's worker processes keep their metrics (router.metrics).

prometheus_client picks its value store when it is imported: in memory, or in files of
the folder that ``PROMETHEUS_MULTIPROC_DIR`` names. So the router's command makes the
folder and names it before anything imports prometheus_client; this module imports
nothing of it.

A router that is killed leaves its folder behind, and in a pod ``/tmp`` is an emptyDir
with a size limit that outlives a restarted container. So the router holds a lock on a
file in its folder while it runs, and one starting removes every folder whose lock it
can take: its router is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"
PREFIX = "asrpool-router-metrics-"
LOCK = ".owner"

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def folder_for(workers: int) -> Iterator[None]:
    """Several workers keep their metrics in one fresh folder, removed when the router
    exits; one worker keeps them in memory. A folder the environment already names is
    used as it is (and left)."""
    if workers == 1 or ENV in os.environ:
        yield
        return
    remove_abandoned(Path(tempfile.gettempdir()))
    folder = tempfile.mkdtemp(prefix=PREFIX)
    with open(Path(folder, LOCK), "w") as owner:
        fcntl.flock(owner, fcntl.LOCK_EX)
        os.environ[ENV] = folder
        try:
            yield
        finally:
            del os.environ[ENV]
            shutil.rmtree(folder, ignore_errors=True)


def remove_abandoned(parent: Path) -> None:
    """Remove the folders of routers that are gone: those whose lock is free. A folder
    without a lock file is left (its router may be making it)."""
    for folder in parent.glob(PREFIX + "*"):
        if _abandoned(folder):
            shutil.rmtree(folder, ignore_errors=True)
            logger.info("removed %s, the metrics of a router that is gone", folder)


def _abandoned(folder: Path) -> bool:
    try:
        with open(folder / LOCK) as owner:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # no lock file, or a live router holds it
        return False
    return True
