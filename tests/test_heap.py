"""Startup's objects are frozen out of the garbage collector (asrpool.common.heap)."""

from __future__ import annotations

import gc

from asrpool.common import heap


def test_startup_objects_leave_the_collectors_sight_and_new_ones_do_not() -> None:
    try:
        startup = [[i] for i in range(1000)]
        heap.freeze_startup_objects()
        assert gc.get_freeze_count() >= len(startup)
        made_later = [[i] for i in range(10)]
        collected = {id(o) for o in gc.get_objects()}  # generations 0-2, not the frozen
        assert not any(id(x) in collected for x in startup)
        assert all(id(x) in collected for x in made_later)
    finally:
        gc.unfreeze()
