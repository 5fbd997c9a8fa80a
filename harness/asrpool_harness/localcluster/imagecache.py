"""Images loaded once per image set: containerd roots kept in a cache, keyed by digests.

Importing an image into containerd reads all of it and unpacks every layer (minutes
for the server image, per node). So a node's containerd does not import: the first
cluster to use a set of images imports them into a *seed* root (a containerd that has
never run a container), kept under the cache and named by a hash of the images'
identities (an archive's index digest, a stored image's name and ID: images.Image);
every node of every later cluster with the same set starts from a copy of that seed.
The copy hard-links the content blobs and unpacked layers
(which containerd never writes again) and copies only the bolt databases, so it takes
a moment whatever the images weigh. A changed image changes its digest, so a new seed:
it starts as such a copy of the seed that holds most of the set's images by name (the
newest among equals: not a later seed of fewer images, which another test's cluster
made), so the import writes and unpacks only the layers that changed (the server
image's torch layer stays), and then drops the images the set no longer has. Older
seeds beyond the newest few are removed, and so is a seed half built (by a build that
failed, at once; by one that was killed, by the next build).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from asrpool.common import processes
from asrpool_harness.localcluster.images import Image

KEEP = 2  # seeds kept: the newest (one holds the server image: some 12 GB)
DATABASE_SUFFIX = ".db"
IDENTITIES = "images.json"  # in a seed: the identities of the images it holds


def default_dir() -> Path:
    """Under ``ASRPOOL_CACHE`` as ``tools/cluster/build`` has it (~/.cache/asrpool)."""
    base = os.environ.get("ASRPOOL_CACHE")
    if base:
        return Path(base) / "containerd-seeds"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "asrpool" / "containerd-seeds"


def key(images: Sequence[Image]) -> str:
    version = subprocess.run(["containerd", "--version"], capture_output=True, text=True,
                             check=False).stdout.strip()
    parts = sorted(image.identity for image in images)
    return hashlib.sha256(json.dumps([version, parts]).encode()).hexdigest()[:24]


def to_import(cache: Path, images: Sequence[Image]) -> tuple[list[Image], bool]:
    """The images that :func:`ensure` has yet to import for ``images``, and whether into
    a first seed (made from nothing: no seed to start from). A seed that does not say
    what it holds (made before it did) is taken to hold them all."""
    if (cache / key(images) / "root").is_dir():
        return [], False
    base = _base(cache, images)
    if base is None:
        return list(images), True
    held = _identities(base, default={image.identity for image in images})
    return [image for image in images if image.identity not in held], False


def _identities(seed: Path, default: set[str]) -> set[str]:
    try:
        return set(json.loads((seed / IDENTITIES).read_text()))
    except (OSError, ValueError):
        return default


def ensure(cache: Path, images: Sequence[Image], build: Callable[[Path], None]) -> Path:
    """The seed root for ``images``; ``build(folder)`` fills a new one when there is none."""
    seed = cache / key(images)
    if not (seed / "root").is_dir():
        _remove_abandoned(cache)
        building = cache / f".{seed.name}.{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir(parents=True)
        try:
            previous = _base(cache, images)
            if previous is not None:  # its unchanged layers are kept, not imported again
                copy(previous / "root", building / "root")
            build(building)
            (building / IDENTITIES).write_text(json.dumps(sorted(i.identity for i in images)))
        except BaseException:  # a failed build (a full disk, a bad archive) keeps nothing
            shutil.rmtree(building, ignore_errors=True)
            raise
        shutil.rmtree(seed, ignore_errors=True)
        building.rename(seed)
    seed.touch()  # its time is its last use
    _prune(cache)
    return seed / "root"


def copy(seed_root: Path, root: Path) -> None:
    """``root`` as a copy of the seed: files hard-linked, databases copied."""
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["cp", "-al", str(seed_root), str(root)], capture_output=True,
                            text=True, check=False)
    if result.returncode != 0:  # another filesystem: copy it all
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(seed_root, root, symlinks=True)
        return
    for database in root.rglob(f"*{DATABASE_SUFFIX}"):
        database.unlink()
        shutil.copy2(seed_root / database.relative_to(root), database)


def _seeds(cache: Path) -> list[Path]:
    """The finished seeds, the most recently used first."""
    seeds = [path for path in cache.iterdir()
             if not path.name.startswith(".") and (path / "root").is_dir()]
    return sorted(seeds, key=lambda path: path.stat().st_mtime, reverse=True)


def _base(cache: Path, images: Sequence[Image]) -> Path | None:
    """The seed a new one for ``images`` starts from: the one that holds most of them by
    name (a stored image's name stays when it is rebuilt), the newest among equals."""
    seeds = _seeds(cache) if cache.is_dir() else []
    if not seeds:
        return None
    wanted = {_name(image.identity) for image in images}

    def held(seed: Path) -> int:
        return len(wanted & {_name(i) for i in _identities(seed, default=set())})

    return max(seeds, key=held)  # max keeps the first (newest) of equals


def _name(identity: str) -> str:
    """A stored image's name without its ID (an archive's identity is its digest)."""
    return identity.rpartition("@")[0] or identity


def _remove_abandoned(cache: Path) -> None:
    """Seeds half built by a process that is gone (killed: it could not clean up)."""
    for path in cache.glob(".*.*"):
        builder = path.name.rpartition(".")[2]
        if builder.isdigit() and not processes.alive(int(builder)):
            shutil.rmtree(path, ignore_errors=True)


def _prune(cache: Path) -> None:
    for old in _seeds(cache)[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)
