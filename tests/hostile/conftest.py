"""Fixtures of the hostile-client suite."""

from __future__ import annotations

import pytest

from asrpool.server import models


@pytest.fixture(scope="session")
def tiny() -> models.LoadedModel:
    return models.load_model("tiny")
