"""A stream whose pod is lost goes on on another pod of its pool, on the same socket.

When a routed stream's pod dies (its connection drops, its heartbeat lapses, or it
breaks the framing rules) or ends the stream for its own reasons (its drain's grace
is over: ``draining``; it sheds streams to keep real time: ``overloaded``; its
``Error`` is then held back), the relay does not tell the client: the session is released
on the lost pod and admitted again, under the same session id, key and pool, to another
of the pool's pods (the waiting room applies, up to its bound). The new pod's ``Ready``
is not passed on; its results are, their times moved on by the audio the client had
sent (``router.retiming``); those samples, and the messages the client had been sent,
are recorded with the new pod (``admissions.Earlier``), so that a resume through any
router goes on on the stream's clock. Meanwhile the client is not read: TCP holds its audio back,
nothing is buffered.

What a moved stream loses: the new pod starts a fresh model context (a few hundred ms
of it), and the words of the audio the lost pod had taken but not answered, and the
audio it had not taken (neither counted in later times). The client's markers that no
pod had answered are sent to the new pod first (``relaying.Relay.markers``). A stream
that cannot move (no pod with room, its key at its limit, the client inside a frame
the lost pod was sending, Redis unreachable, or moved ``MAX_MOVES`` times already)
ends as before: ``pod_lost``, or the pod's own ``Error`` and close.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import redis

from asrpool.router import admissions, placing, pods, proxying, refusals, relaying, wiring

log = logging.getLogger(__name__)

MAX_MOVES = 3  # per stream: a pool whose pods keep dying ends the stream, not a loop
Moved = tuple[admissions.Session, pods.Opened]


async def move(relay: relaying.Relay, request: admissions.Request,
               session: admissions.Session, lost: proxying.Movable,
               deps: wiring.Deps) -> Moved | None:
    """The stream admitted to another pod and its link opened (its ``Ready`` read), or
    None when it cannot move (the caller then ends it with ``pod_lost``)."""
    why = lost.detail if isinstance(lost, proxying.PodLost) else f"it said {lost.code}"
    log.warning("session %s lost its pod %s (%s): moving it", session.session_id,
                session.pod_id, why)
    request = dataclasses.replace(request, earlier=admissions.Earlier(*relay.clock()))
    try:
        await deps.admissions.release(session)
        placed = await placing.place(request, deps, _left(relay), avoid=[session.pod_id])
    except redis.RedisError as exc:
        deps.meters.redis_errors.labels("move").inc()
        log.warning("session %s not moved, Redis unreachable: %s", session.session_id, exc)
        deps.meters.moves.labels("failed").inc()
        return None
    if isinstance(placed, refusals.Refusal):
        log.warning("session %s not moved: %s", session.session_id, placed.message)
        deps.meters.moves.labels("failed").inc()
        return None
    log.info("session %s moved to pod %s", session.session_id, placed[0].pod_id)
    deps.meters.moves.labels("moved").inc()
    return placed


def _left(relay: relaying.Relay) -> asyncio.Event:
    """Set once the client leaves (the relay sees its connection drop)."""
    left = asyncio.Event()
    if relay.client_gone.done():
        left.set()
    else:
        relay.client_gone.add_done_callback(lambda _: left.set())
    return left
