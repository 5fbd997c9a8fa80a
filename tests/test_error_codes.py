"""Error codes have one owner, ``protocol.ErrorCode``, and refusals one type,
``protocol.Refusal`` (the pod's and the router's): each code is documented, travels as a
plain MessagePack string, and a router maps a pod's unknown code to ``internal``."""

from __future__ import annotations

import re
from pathlib import Path

import msgpack

from asrpool.common import protocol
from asrpool.router import refusals
from asrpool.server import outcomes

DOCS = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def test_every_code_is_in_the_documented_list_and_no_other() -> None:
    text = DOCS.read_text()
    start = text.index("The codes are\none enum")
    paragraph = text[start:text.index("\n\n", start)]
    documented = set(re.findall(r"`([a-z_]+)`", paragraph))
    assert documented == {code.value for code in protocol.ErrorCode}


def test_a_code_travels_as_a_plain_string() -> None:
    body = msgpack.unpackb(protocol.error("full", protocol.ErrorCode.BUSY))
    assert body == {"type": "Error", "message": "full", "code": "busy"}
    assert type(body["code"]) is str


def test_a_pods_code_is_ours_or_internal() -> None:
    assert protocol.error_code("too_slow") is protocol.ErrorCode.TOO_SLOW
    assert protocol.error_code("from_a_newer_pod") is protocol.ErrorCode.INTERNAL
    assert protocol.error_code("") is protocol.ErrorCode.INTERNAL


def test_the_pod_and_the_router_refuse_with_one_type() -> None:
    assert outcomes.Failed is refusals.Refusal is protocol.Refusal
    refusal = refusals.queue_full(3)
    assert (refusal.code, refusal.close_code) == ("queue_full", protocol.CloseCode.TRY_AGAIN)
    assert msgpack.unpackb(refusal.frame())["message"] == refusal.message
    drained = msgpack.unpackb(outcomes.shutting_down(24_000, 48_000).frame())
    assert (drained["code"], drained["processed_seconds"]) == ("draining", 1.0)
