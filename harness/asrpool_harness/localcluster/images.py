"""The images to load into real nodes: OCI archives, or images in podman's storage.

An argument is an OCI archive, a folder of them (``*.tar``), or the name of an image
in podman's (containers-storage) store. Each is known by what names its content: an
archive by the digest of its ``index.json``, a stored image by its name and ID, so the
seed that holds it is found without copying anything (imagecache). Only to fill a new
seed is a stored image copied out, by ``skopeo``, into an OCI layout folder that
containerd reads as the archive it would be and that is removed at once: no archive of
the server's gigabytes is kept, and none is written, which would first cost skopeo a
temporary copy of the same size.

Only its changed layers are copied: a layer the seed has unpacked already (its chain
ID's snapshot is there) stands in the folder as a sparse file of its size, which skopeo
takes for the blob it would write, and which is left out of what containerd reads
(containerd unpacks no layer whose snapshot exists, so never asks for its blob). The
layers go uncompressed (``tar``, as podman stores them: their digests are the chain's
diff IDs), so a rebuilt server image costs its last few megabytes, not gigabytes
compressed and read again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
import tarfile
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from asrpool.common import processes

BLOBS_ROOT = "blobs"
BLOBS = f"{BLOBS_ROOT}/sha256"
UNCOMPRESSED = frozenset({"application/vnd.oci.image.layer.v1.tar",
                          "application/vnd.docker.image.rootfs.diff.tar"})
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


@dataclasses.dataclass(frozen=True)
class Layout:
    """An OCI layout folder, the name its image has there, and the blobs in it that
    stand for layers already unpacked (sparse files: never to be read)."""

    folder: Path
    name: str
    stand_ins: frozenset[str]  # paths relative to the folder


def importing_name(name: str) -> str:
    """The name an image is imported under before it takes its own: until the new image
    is unpacked (its snapshots referenced), the old one holds the layers it stands in
    for, which containerd's collector would otherwise be free to remove."""
    return f"localhost/asrpool-importing/{re.sub(r'[^a-z0-9._-]+', '-', name.lower())}:latest"


@contextlib.contextmanager
def layout(image: Image, scratch: Path, unpacked: Collection[str] = ()) -> Iterator[Layout]:
    """A stored image as an OCI layout folder under ``scratch``, removed afterwards; its
    layers whose chain IDs are ``unpacked`` are stand-ins, not copied."""
    folder = scratch / re.sub(r"[^A-Za-z0-9_.-]+", "_", image.name)
    shutil.rmtree(folder, ignore_errors=True)
    (folder / BLOBS).mkdir(parents=True)
    try:
        stand_ins = frozenset(_stand_in(folder, layer)
                              for layer in _unpacked_layers(image, unpacked))
        name = importing_name(image.name) if stand_ins else image.name
        result = _run(["skopeo", "copy", "--quiet", "--dest-oci-accept-uncompressed-layers",
                       f"containers-storage:{image.name}", f"oci:{folder}:{name}"],
                      COPY_TIMEOUT)
        if result.returncode != 0:
            raise processes.StartError(f"image {image.name}: {result.stderr.strip()}")
        yield Layout(folder, name, stand_ins)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """The OCI chain ID of each layer: a snapshot's name in containerd."""
    chain: list[str] = []
    for diff_id in diff_ids:
        if not chain:
            chain.append(diff_id)
            continue
        joined = f"{chain[-1]} {diff_id}".encode()
        chain.append(f"sha256:{hashlib.sha256(joined).hexdigest()}")
    return chain


def _unpacked_layers(image: Image, unpacked: Collection[str]) -> list[dict[str, Any]]:
    """The image's layers, as its stored manifest lists them, whose snapshots exist:
    uncompressed ones only (their digests are their diff IDs)."""
    if not unpacked:
        return []
    result = _run(["skopeo", "inspect", "--raw", f"containers-storage:{image.name}"],
                  INSPECT_TIMEOUT)
    if result.returncode != 0:
        raise processes.StartError(f"image {image.name}: {result.stderr.strip()}")
    layers: list[dict[str, Any]] = json.loads(result.stdout).get("layers", [])
    found = []
    for layer, chain_id in zip(layers, chain_ids([layer["digest"] for layer in layers]),
                               strict=True):
        if layer.get("mediaType") not in UNCOMPRESSED:
            break  # a compressed digest is no diff ID: the chain cannot be told
        if chain_id in unpacked:
            found.append(layer)
    return found


def _stand_in(folder: Path, layer: Mapping[str, Any]) -> str:
    """A sparse file of the layer's size where its blob would be written."""
    algorithm, _, digest = str(layer["digest"]).partition(":")
    relative = f"{BLOBS_ROOT}/{algorithm}/{digest}"
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as blob:
        blob.truncate(int(layer["size"]))
    return relative


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
