"""``tools/images/build`` as the tests call it: the images it built, or why it could not."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tools" / "images" / "build"
BUILD_TIMEOUT = 3600.0  # the server image's first build: several minutes


def build_environment() -> dict[str, str]:
    """The tool's environment in the tests: on the base ``make images`` made before the
    suite, whatever snapshot the Debian mirror published since (a CI run once found a new
    one mid-suite and rebuilt every image inside a test's time)."""
    return {**os.environ, "ASRPOOL_IMAGES_BASE": "cached"}
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


def missing_tool(stderr: str) -> str | None:
    """The tool's one line for a missing tool ('X is missing: apt-get install P')."""
    for line in stderr.splitlines():
        if " is missing: apt-get install " in line:
            return line.strip()
    return None


def parse(stdout: str) -> dict[str, Built]:
    found = {}
    for line in stdout.splitlines():
        match = LINE.match(line)
        if match:
            found[match["image"]] = Built(match["image"], match["name"], match["id"],
                                          float(match["mb"]))
    return found


def build(images: Sequence[str], unavailable: Callable[[str], None]) -> dict[str, Built]:
    """Build (or find unchanged) ``images``; a missing tool goes to ``unavailable`` (a
    skip, or under CI a failure), any other failure fails the test."""
    try:
        done = subprocess.run([str(BUILD), *images], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT, check=False, env=build_environment())
    except FileNotFoundError as missing:
        unavailable(f"cannot run {BUILD}: {missing}")
        raise
    if done.returncode != 0:
        reason = missing_tool(done.stderr)
        if reason is not None:
            unavailable(reason)
        pytest.fail(f"tools/images/build failed:\n{done.stderr[-3000:]}")
    return parse(done.stdout)
