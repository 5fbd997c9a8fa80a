"""A real image registry: distribution's ``docker-registry`` (Debian's package), serving
plain HTTP on one address, its blobs in a folder, for tests that push images with
skopeo and let the nodes' containerd pull them."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from asrpool.common import processes

START_TIMEOUT = 30.0


def _config(address: str, storage: Path) -> str:
    """distribution's configuration (YAML, of which JSON is a part)."""
    return json.dumps({
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(storage)}},
        "http": {"addr": address},
    })


def _answers(address: str) -> bool:
    with urllib.request.urlopen(f"http://{address}/v2/", timeout=2.0) as reply:
        return bool(reply.status == 200)


def catalog(address: str) -> list[str]:
    """The repositories the registry holds."""
    with urllib.request.urlopen(f"http://{address}/v2/_catalog", timeout=5.0) as reply:
        return list(json.load(reply)["repositories"])


@contextlib.contextmanager
def running(address: str, folder: Path) -> Iterator[str]:
    """A registry listening on ``address`` (HOST:PORT) until the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.yml"
    config.write_text(_config(address, folder / "storage"))
    child = processes.spawn("docker-registry", ["docker-registry", "serve", str(config)],
                            folder / "registry.log")
    try:
        processes.wait_until(lambda: _answers(address), START_TIMEOUT,
                             f"docker-registry on {address}", [child])
        yield address
    finally:
        child.stop(10)
