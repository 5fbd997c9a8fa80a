"""Opening a stream on a server pod: connect, then read the pod's first word.

The pod is the final arbiter of its slots: it answers ``Ready`` when it took the
stream, or ``Error`` (``busy``, ``draining``, ``bad_resume_token``) and a close. The
router reads that first frame before it forwards anything, so a refusal can be turned
into a try on another pod.
"""

from __future__ import annotations

import dataclasses
import logging

import aiohttp

from asrpool.common import protocol, rates
from asrpool.router import dialects, links, settings

log = logging.getLogger(__name__)

# The pod's 101 names how many samples of the stream it has received, so that a
# resuming client knows where to continue; the router passes it on.


@dataclasses.dataclass(frozen=True)
class Opened:
    """The pod took the stream; ``first`` is its first message (``Ready``, or OpenAI's
    ``session.created``), to forward as is."""

    link: links.PodLink
    first: bytes
    pod_session_id: str
    pod_resume_token: str
    resume_offset: str  # samples of audio the pod holds for this stream (on a resume)


@dataclasses.dataclass(frozen=True)
class Refused:
    """The pod answered with an ``Error`` frame (forwarded to the client when final)."""

    code: protocol.ErrorCode
    message: str
    frame: bytes


@dataclasses.dataclass(frozen=True)
class Unreachable:
    reason: str


Outcome = Opened | Refused | Unreachable


def headers(config: settings.RouterSettings, pool: str,
            pod_resume_token: str = "", received: int | None = None) -> dict[str, str]:
    """The router always asks the pod to keep a stream whose link drops: its own
    clients resume through any router. A resume names the messages of this pod's that
    its client has (``received``), so the pod sends again those lost in flight."""
    out = {protocol.RESUMABLE_HEADER: "1"}
    token = config.pod_token_for(pool)
    if token is not None:
        out[protocol.POD_TOKEN_HEADER] = token
    if pod_resume_token:
        out[protocol.RESUME_TOKEN_HEADER] = pod_resume_token
    if pod_resume_token and received is not None:
        out[protocol.RESUME_RECEIVED_HEADER] = str(received)
    return out


async def open_stream(
    address: str, pool: str, config: settings.RouterSettings, pod_resume_token: str = "",
    received: int | None = None, dialect: dialects.Dialect = dialects.KYUTAI,
) -> Outcome:
    try:
        link, first = await links.dial(
            address,
            dialect.pod_path,
            {**headers(config, pool, pod_resume_token, received), **dict(dialect.pod_headers)},
            config.max_message_bytes,
            config.pod_connect_timeout_seconds,
            dialect.opcode,
        )
    except links.HandshakeFailed as exc:
        if exc.status == 429:  # the pod is over its new streams per second
            return Refused(rates.TOO_MANY_STREAMS, str(exc), b"")
        log.warning("pod %s unreachable: %s", address, exc)
        return Unreachable(f"{type(exc).__name__}: {exc}")
    except (OSError, TimeoutError, ValueError) as exc:
        log.warning("pod %s unreachable: %s", address, exc)
        return Unreachable(f"{type(exc).__name__}: {exc}")
    # No keepalive pings to pods: a pod that applies backpressure stops reading its
    # socket, pings go unanswered, and a healthy stream would be cut. A dead pod closes
    # its sockets or lets its heartbeat lapse (leasing.note_heartbeat).
    taken, code, message = dialect.first(first)
    if taken:
        got = link.response.headers if link.response is not None else {}
        return Opened(
            link,
            first,
            pod_session_id=got.get(protocol.SESSION_ID_HEADER, ""),
            pod_resume_token=got.get(protocol.RESUME_TOKEN_HEADER, ""),
            resume_offset=got.get(protocol.RESUME_OFFSET_HEADER, ""),
        )
    await link.close()
    return Refused(protocol.error_code(code), message, first)


async def end_stream(address: str, pool: str, config: settings.RouterSettings,
                     pod_resume_token: str) -> bool:
    """Ask the pod to end a stream now (``DELETE /api/asr-streaming``, its resume token
    naming it): for a clean end whose close the pod has not read, because it holds back
    the audio sent before it. Whether the pod ended it; a pod that cannot be asked keeps
    the stream for its resume grace, as after any lost link."""
    url = f"http://{address}{protocol.STREAMING_PATH}"
    sent = {**headers(config, pool, pod_resume_token)}
    sent.pop(protocol.RESUMABLE_HEADER, None)
    timeout = aiohttp.ClientTimeout(total=config.pod_connect_timeout_seconds)
    try:
        async with (aiohttp.ClientSession(timeout=timeout) as client,
                    client.delete(url, headers=sent) as reply):
            return reply.status == 204
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("pod %s not asked to end a stream (kept for its grace): %s", address, exc)
        return False
