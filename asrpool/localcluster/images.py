"""The images to load into real nodes: OCI archives, or images in podman's storage.

An argument is an OCI archive, a folder of them (``*.tar``), or the name of an image
in podman's (containers-storage) store. Each is known by what names its content: an
archive by the digest of its ``index.json``, a stored image by its name and ID, so the
seed that holds it is found without copying anything (imagecache). Only to fill a new
seed is a stored image copied out, by ``skopeo``, into an OCI layout folder that
containerd reads as the archive it would be and that is removed at once: no archive of
the server's gigabytes is kept, and none is written, which would first cost skopeo a
temporary copy of the same size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from asrpool.common import processes

INSPECT_TIMEOUT = 120.0  # podman waits for its store's lock while an image builds
COPY_TIMEOUT = 1800.0


@dataclasses.dataclass(frozen=True)
class Image:
    """An archive (``name`` is its path) or a stored image; ``identity`` names its content."""

    name: str
    identity: str
    stored: bool


def resolve(sources: Sequence[str]) -> list[Image]:
    found: list[Image] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found += [_archive(archive) for archive in sorted(path.glob("*.tar"))]
        elif path.is_file():
            found.append(_archive(path))
        else:
            found.append(Image(source, f"{source}@{_image_id(source)}", stored=True))
    return found


@contextlib.contextmanager
def layout(image: Image, scratch: Path) -> Iterator[Path]:
    """A stored image as an OCI layout folder under ``scratch``, removed afterwards."""
    folder = scratch / re.sub(r"[^A-Za-z0-9_.-]+", "_", image.name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        result = _run(["skopeo", "copy", "--quiet", f"containers-storage:{image.name}",
                       f"oci:{folder}:{image.name}"], COPY_TIMEOUT)
        if result.returncode != 0:
            raise processes.StartError(f"image {image.name}: {result.stderr.strip()}")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def archive_digest(archive: Path) -> str:
    """The sha256 of the archive's ``index.json`` (which names every blob by digest)."""
    try:
        with tarfile.open(archive) as tar:
            member = tar.extractfile("index.json")
            if member is None:
                raise KeyError("index.json")
            return hashlib.sha256(member.read()).hexdigest()
    except (OSError, KeyError, tarfile.TarError) as exc:
        raise processes.StartError(f"{archive} is not an OCI archive: {exc}") from exc


def _archive(path: Path) -> Image:
    return Image(str(path), archive_digest(path), stored=False)


def size(image: Image) -> int:
    """Bytes of the image: its archive's, or what podman reports of a stored one."""
    if not image.stored:
        return Path(image.name).stat().st_size
    result = _run(["podman", "image", "inspect", "--format", "{{.Size}}", image.name],
                  INSPECT_TIMEOUT)
    text = result.stdout.strip()
    if result.returncode != 0 or not text.isdigit():
        raise processes.StartError(f"image {image.name}: podman gave no size "
                                   f"({result.stderr.strip()})")
    return int(text)


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
