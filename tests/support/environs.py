"""A process environment of chosen ``ASRPOOL_*`` variables alone (the ``environ``
fixture of tests/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from asrpool.common import environment

Environ = Callable[[dict[str, str]], None]


def alone(monkeypatch: pytest.MonkeyPatch) -> Environ:
    """Removes every ``ASRPOOL_*`` variable of this machine (in any case, twins too) and
    answers a function that sets a container's environment (in place of the last one)."""

    def clear() -> None:
        for name in list(os.environ):
            if name.upper().startswith(environment.PREFIX):
                monkeypatch.delenv(name)

    clear()

    def apply(env: dict[str, str]) -> None:
        clear()
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    return apply
