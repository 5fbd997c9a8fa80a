"""The images to load into real nodes, as OCI archives.

An argument is an OCI archive, a folder of them (``*.tar``), or the name of an image
in podman's (containers-storage) store, which ``skopeo`` copies to an archive first,
kept under the cache by image ID: an image that has not changed is not copied again.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from asrpool.common import processes

INSPECT_TIMEOUT = 120.0  # podman waits for its store's lock while an image builds
COPY_TIMEOUT = 1800.0


def archives(sources: Sequence[str], cache: Path) -> list[Path]:
    found: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found += sorted(path.glob("*.tar"))
        elif path.is_file():
            found.append(path)
        else:
            found.append(_from_storage(source, cache))
    return found


def _from_storage(name: str, cache: Path) -> Path:
    image_id = _image_id(name)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    archive = cache / f"{safe}@{image_id[:16]}.tar"
    if archive.is_file():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    for old in cache.glob(f"{safe}@*.tar"):  # the same name's earlier builds
        old.unlink()
    partial = archive.with_suffix(".part")
    result = _run(["skopeo", "copy", "--quiet", f"containers-storage:{name}",
                   f"oci-archive:{partial}:{name}"], COPY_TIMEOUT)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise processes.StartError(f"image {name}: {result.stderr.strip()}")
    partial.rename(archive)
    return archive


def _image_id(name: str) -> str:
    result = _run(["podman", "image", "inspect", "--format", "{{.Id}}", name], INSPECT_TIMEOUT)
    if result.returncode != 0 or not result.stdout.strip():
        raise processes.StartError(f"image {name}: not a file, a folder or an image in "
                                   f"podman's storage ({result.stderr.strip()})")
    return result.stdout.strip()


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise processes.StartError(f"{argv[0]} {argv[1]} took over {timeout:.0f} s "
                                   "(is an image build holding podman's store?)") from exc
