"""How the long-running commands log: one line per record, to stderr."""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str | int) -> None:
    """The root logger at ``level`` (a name such as ``"info"``, or a number)."""
    logging.basicConfig(level=level.upper() if isinstance(level, str) else level, format=FORMAT)
