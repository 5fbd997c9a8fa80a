"""Free disk for real nodes, checked before anything is filled: a machine short of it
fails at the start with one line saying how much it needs, not minutes later with "no
space left on device" in the middle of an image import.

The figures are lower bounds from measurements here, so that no machine that could run
the cluster is refused: while tests run, the nodes' containers, logs and kubelet state
take :data:`RUNNING_BYTES`; a first seed (imagecache) holds every image unpacked, at
least :data:`SEED_FACTOR` times their size (13 GB for 8.4 GB of images, and while the
server image is imported its OCI layout beside it); a later seed starts as a hard-linked
copy of the newest one, but each image it imports is first copied out whole into an OCI
layout (:data:`LAYOUT_FACTOR` times its size: a changed server image costs its 7.8 GB
while it is imported, even when only its last layer changed).
"""

from __future__ import annotations

import shutil
from pathlib import Path

GIB = 1 << 30
RUNNING_BYTES = 2 * GIB
SEED_FACTOR = 1.5
LAYOUT_FACTOR = 1.0


def needed(image_bytes: int, first_seed: bool) -> int:
    """Bytes the cluster needs free: while it runs, and to import ``image_bytes`` of
    images into its seed (a first one, or one started from the newest)."""
    return RUNNING_BYTES + int((SEED_FACTOR if first_seed else LAYOUT_FACTOR) * image_bytes)


def problem(where: Path, image_bytes: int, first_seed: bool) -> str | None:
    """What to tell when the disk under ``where`` has less free than :func:`needed`."""
    need = needed(image_bytes, first_seed)
    free = shutil.disk_usage(where).free
    if free >= need:
        return None
    seed = "a first seed" if first_seed else "a seed"
    why = (f"{seed} of {image_bytes / GIB:.1f} GB of new images, and the nodes"
           if image_bytes else "the nodes")
    return (f"real nodes need at least {need / GIB:.1f} GB free on the disk of {where} for "
            f"{why}; it has {free / GIB:.1f} GB: free some (old clones, podman images, "
            f"seeds under {where})")
