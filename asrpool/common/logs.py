"""How the long-running commands log: one line per record, to stderr."""

from __future__ import annotations

import logging

import pydantic

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogSettings(pydantic.BaseModel):
    """Every long-running command's logging."""

    log_level: str = pydantic.Field(default="info", description="debug | info | warning | error")


def configure(level: str | int) -> None:
    """The root logger at ``level`` (a name such as ``"info"``, or a number)."""
    logging.basicConfig(level=level.upper() if isinstance(level, str) else level, format=FORMAT)
