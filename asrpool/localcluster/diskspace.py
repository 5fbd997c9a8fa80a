"""Free disk for real nodes, checked before anything is filled: a machine short of it
fails at the start with one line saying how much it needs, not minutes later with "no
space left on device" in the middle of an image import.

The figures are lower bounds from measurements here, so that no machine that could run
the cluster is refused: while tests run, the nodes' containers, logs and kubelet state
take :data:`RUNNING_BYTES`; a first seed (imagecache) holds every image unpacked, at
least :data:`SEED_FACTOR` times their size (13 GB for 8.4 GB of images, and while the
server image is imported its OCI layout beside it). A later seed starts as a hard-linked
copy of the newest one and imports only what changed, so nothing is counted for it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

GIB = 1 << 30
RUNNING_BYTES = 2 * GIB
SEED_FACTOR = 1.5


def needed(image_bytes: int, first_seed: bool) -> int:
    """Bytes the cluster needs free: while it runs, and for a first seed of the images."""
    return RUNNING_BYTES + (int(SEED_FACTOR * image_bytes) if first_seed else 0)


def problem(where: Path, image_bytes: int, first_seed: bool) -> str | None:
    """What to tell when the disk under ``where`` has less free than :func:`needed`."""
    need = needed(image_bytes, first_seed)
    free = shutil.disk_usage(where).free
    if free >= need:
        return None
    why = (f"a first seed of {image_bytes / GIB:.1f} GB of images, and the nodes"
           if first_seed else "the nodes")
    return (f"real nodes need at least {need / GIB:.1f} GB free on the disk of {where} for "
            f"{why}; it has {free / GIB:.1f} GB: free some (old clones, podman images, "
            f"seeds under {where})")
