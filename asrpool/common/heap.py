"""The garbage collector and long-lived processes (the router and the server pod).

A full collection walks every tracked object while the process does nothing else (the
GIL is held: the event loop, every relayed stream and the engine thread wait). After
startup most objects are modules, the app, settings and, on a pod, the model: they
live as long as the process. Freezing them once startup is done (``gc.freeze``, as
CPython's docs advise for long-running servers) leaves full collections only what was
made since: measured here, 50-70 ms for a router's 83,000 startup objects, then none.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Collect what startup left behind, then keep the rest out of future collections."""
    gc.collect()
    gc.freeze()
