"""The images to load into real nodes, as OCI archives.

An argument is an OCI archive, a folder of them (``*.tar``), or the name of an image
in podman's (containers-storage) store, which ``skopeo`` copies to an archive first.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from asrpool.common import processes


def archives(sources: Sequence[str], scratch: Path) -> list[Path]:
    found: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found += sorted(path.glob("*.tar"))
        elif path.is_file():
            found.append(path)
        else:
            found.append(_from_storage(source, scratch))
    return found


def _from_storage(name: str, scratch: Path) -> Path:
    scratch.mkdir(parents=True, exist_ok=True)
    archive = scratch / (re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".tar")
    archive.unlink(missing_ok=True)
    result = subprocess.run(["skopeo", "copy", "--quiet", f"containers-storage:{name}",
                             f"oci-archive:{archive}:{name}"],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise processes.StartError(f"image {name}: not a file, a folder or an image in "
                                   f"podman's storage ({result.stderr.strip()})")
    return archive
