"""The project's images, built once per session by ``tools/images/build``.

Building needs buildah, podman, runc, mmdebstrap (and gcc and Go for the pause image);
``make system-deps`` installs them. Without them these tests skip with the one line
the tool prints (naming the Debian package); under CI (``CI=true``) that is a failure
instead, so CI can never go green by skipping. A build that fails is always a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tools" / "images" / "build"
IMAGES = ("control", "server", "redis", "pause")
BUILD_TIMEOUT = 3600.0
# The tool's line per image: kind, first name, ID, size, build seconds.
LINE = re.compile(r"^(?P<image>\w+)\s+(?P<name>\S+)\s+(?P<id>[0-9a-f]{12})\s+"
                  r"(?P<mb>[\d.]+) MB\s+(?P<seconds>\d+)s$")


@dataclass(frozen=True)
class Built:
    """One image the tool built: its kind, its first name and its ID."""

    image: str
    name: str
    id: str
    megabytes: float


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the image tests, but: {reason}")
    pytest.skip(reason)


def _missing_tool(stderr: str) -> str | None:
    """The tool's one line for a missing tool ('X is missing: apt-get install P')."""
    for line in stderr.splitlines():
        if " is missing: apt-get install " in line:
            return line.strip()
    return None


def _parse(stdout: str) -> dict[str, Built]:
    found = {}
    for line in stdout.splitlines():
        match = LINE.match(line)
        if match:
            found[match["image"]] = Built(match["image"], match["name"], match["id"],
                                          float(match["mb"]))
    return found


@pytest.fixture(scope="session")
def images() -> dict[str, Built]:
    try:
        done = subprocess.run([str(BUILD), *IMAGES], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT, check=False)
    except FileNotFoundError as missing:
        _unavailable(f"cannot run {BUILD}: {missing}")
    if done.returncode != 0:
        reason = _missing_tool(done.stderr)
        if reason is not None:
            _unavailable(reason)
        pytest.fail(f"tools/images/build failed:\n{done.stderr[-3000:]}")
    return _parse(done.stdout)
