"""A pod over its new streams per second: a client's 429 is held back (no retry storm),
a router's link (it carries the pod token) hears it at once, for its client waits."""

from __future__ import annotations

from collections.abc import Callable

import h11
import pydantic
import pytest

from asrpool.common import limits, protocol, rates
from asrpool.server import pods, settings

TOKEN = "pod-token-for-tests"


def _pod(token: str | None) -> pods.Pod:
    config = settings.ServerSettings(
        new_streams_per_second=1.0, new_streams_burst=1.0,
        pod_token=pydantic.SecretStr(token) if token is not None else None)
    return pods.Pod(config, pods.Deps(engine_factory=_no_engine))


def _no_engine(*_: object) -> object:
    raise AssertionError("no engine in these tests")


def _head(token: str | None = None) -> list[tuple[bytes, bytes]]:
    head = [(b"upgrade", b"websocket")]
    return [*head, (protocol.POD_TOKEN_HEADER.encode(), token.encode())] if token else head


@pytest.mark.parametrize(("pod_token", "sent", "held"), [
    (TOKEN, TOKEN, False),  # a router's link
    (TOKEN, "not-the-token", True),
    (TOKEN, None, True),
    (None, TOKEN, True),  # a pod without a token trusts nobody with one
])
async def test_only_a_router_link_is_answered_at_once(
        pod_token: str | None, sent: str | None, held: bool) -> None:
    pod = _pod(pod_token)
    assert pod.gate.new_stream("10.0.0.9", _head(sent)) is None  # the burst
    refused = pod.gate.new_stream("10.0.0.9", _head(sent))
    assert refused is not None and refused.status == 429
    assert refused.held is held
    assert refused.message.startswith("too_many_streams: over 1 new streams per second on"
                                      " this pod")


async def test_two_token_headers_are_no_router() -> None:
    pod = _pod(TOKEN)
    pod.gate.new_stream("10.0.0.9", _head(TOKEN))
    twice = [*_head(TOKEN), (protocol.POD_TOKEN_HEADER.encode(), b"other")]
    refused = pod.gate.new_stream("10.0.0.9", twice)
    assert refused is not None and refused.held


@pytest.mark.parametrize(("sent", "counted"), [
    (TOKEN, False),  # a router's resume: its clients come back after a router died
    ("not-the-token", True),  # a forged resume is as cheap as a new stream
    (None, True),
])
async def test_only_a_routers_resumes_pass_the_rate(sent: str | None, counted: bool) -> None:
    pod = _pod(TOKEN)
    resume = [*_head(sent), (protocol.RESUME_TOKEN_HEADER.encode(), b"sid.token")]
    assert pod.gate.new_stream("10.0.0.9", resume) is None  # the burst, or not counted
    assert (pod.gate.new_stream("10.0.0.9", resume) is not None) is counted


class _Gate:
    def __init__(self, answer: Callable[[], rates.Throttled | None]) -> None:
        self.answer = answer

    def new_stream(self, address: str, headers: object) -> rates.Throttled | None:
        return self.answer()


@pytest.mark.parametrize("held", [True, False])
def test_the_connection_keeps_whether_the_gate_holds_its_429(held: bool) -> None:
    throttled = rates.Throttled("too_many_streams: over 1 new streams per second", 1.0,
                                held=held)
    conn = limits.Connection(limits.Limits(), _Gate(lambda: throttled))
    conn.receive_data(b"GET /api/asr-streaming HTTP/1.1\r\nHost: pod\r\nUpgrade: websocket\r\n"
                      b"Connection: Upgrade\r\n\r\n")
    assert conn.next_event() is h11.PAUSED
    assert conn.throttled is throttled  # what H11Protocol answers, held or at once
    assert conn.throttled.status == 429 and conn.throttled.held is held
