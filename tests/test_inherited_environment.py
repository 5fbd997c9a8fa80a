"""``processes.inherited_environment``: children started inside see the values; the
environment is as it was afterwards, a variable that was not there included."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from asrpool.common import processes


def test_children_see_the_values_and_the_environment_is_restored(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASRPOOL_TEST_KEPT", "before")
    monkeypatch.delenv("ASRPOOL_TEST_NEW", raising=False)
    with processes.inherited_environment({"ASRPOOL_TEST_KEPT": "inside",
                                          "ASRPOOL_TEST_NEW": "new"}):
        seen = subprocess.run([sys.executable, "-c", "import os; print(os.environ["
                               "'ASRPOOL_TEST_KEPT'], os.environ['ASRPOOL_TEST_NEW'])"],
                              capture_output=True, text=True, check=True).stdout.split()
    assert seen == ["inside", "new"]
    assert os.environ["ASRPOOL_TEST_KEPT"] == "before"
    assert "ASRPOOL_TEST_NEW" not in os.environ
