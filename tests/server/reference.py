"""In-process references: the same sample sequence through a BatchedEngine of the same size.

They run on one torch thread, as the test servers do (``servers.ServerProcess``): the
thread count can flip a near tie in a long stream, so both sides must agree on it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from asrpool.server import engine, events, models, transcribing
from tests.support import kyutai_client


@functools.cache
def _tiny() -> models.LoadedModel:
    return models.load_model("tiny")


def words(messages: Iterable[Mapping[str, Any]], batch_size: int) -> list[tuple[Any, ...]]:
    """Word/EndWord of a stream fed ``messages`` in slot 0 of a fresh engine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with engine.BatchedEngine(_tiny(), batch_size) as eng:
            out = transcribing.run_messages(eng, [dict(m) for m in messages])
    finally:
        torch.set_num_threads(threads)
    # run_messages finishes the message in which the marker returns; a client stops at it.
    returned = next(i for i, e in enumerate(out) if isinstance(e, events.Marker))
    return kyutai_client.words(events.to_message(e) for e in out[:returned])


def file_words(pcm: np.ndarray, batch_size: int) -> list[tuple[Any, ...]]:
    return words(kyutai_client.file_messages(pcm), batch_size)


def short_words(pcm: np.ndarray, batch_size: int) -> list[tuple[Any, ...]]:
    return words(kyutai_client.short_messages(pcm), batch_size)
