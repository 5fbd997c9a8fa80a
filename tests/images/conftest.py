"""The project's images, built once per session by ``tools/images/build``.

Building needs buildah, podman, runc, mmdebstrap (and gcc and Go for the pause image);
``make system-deps`` installs them. Without them these tests skip with the one line
the tool prints (naming the Debian package); under CI (``CI=true``) that is a failure
instead, so CI can never go green by skipping. A build that fails is always a failure.
"""

from __future__ import annotations

import os

import pytest

from tests.support import imagebuilds

ROOT = imagebuilds.ROOT
BUILD = imagebuilds.BUILD
IMAGES = ("control", "server", "redis", "pause")
Built = imagebuilds.Built


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the image tests, but: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def images() -> dict[str, Built]:
    return imagebuilds.build(IMAGES, _unavailable)
