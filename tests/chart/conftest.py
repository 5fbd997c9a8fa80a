"""Fixtures of the chart's tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.chart.containers import PREFIX, Environ


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> Iterator[Environ]:
    """Set a container's environment, alone (no ASRPOOL_* of this machine leaks in)."""
    for name in list(os.environ):
        if name.startswith(PREFIX):
            monkeypatch.delenv(name)

    def apply(env: dict[str, str]) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    yield apply
