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


# Every router refusal as a client meets it, written down before the refusal types were
# merged (code, message, close code): the merge changed none of them.
ROUTER_REFUSALS = [
    (refusals.busy, (), "busy", protocol.BUSY_MESSAGE, 1013),
    (refusals.unknown_pool, ("x",), "unknown_pool", "unknown pool 'x'", 1008),
    (refusals.key_limit, ("k", 2), "key_limit", "API key 'k' already has its 2 concurrent"
     " streams", 1008),
    (refusals.queue_full, (5,), "queue_full", "no free channels and the wait queue is full"
     " (5 waiting); try again later", 1013),
    (refusals.key_queue_full, ("k", 3), "key_queue_full", "API key 'k' already has 3 streams"
     " waiting for a channel", 1013),
    (refusals.pod_throttled, (), "too_many_streams", "the pod is over its new streams per"
     " second; try again in a second", 1013),
    (refusals.client_left, (), "client_left", "the client left during admission", 1000),
    (refusals.bad_resume_token, (), "bad_resume_token", "unknown or expired resume token", 1008),
    (refusals.pod_gone, (), "pod_lost", "the pod serving this session is gone; start a new"
     " stream", 1011),
    (refusals.pod_lost, (), "pod_lost", "the pod serving this stream failed; start a new"
     " stream", 1011),
    (refusals.unavailable, (), "unavailable", "the router cannot reach its session registry;"
     " try again shortly", 1013),
    (refusals.too_large, (20, 10), "too_large", "message of 20 bytes exceeds the limit of 10"
     " bytes", 1009),
]


def test_every_router_refusal_is_what_clients_met_before() -> None:
    for make, args, code, message, close_code in ROUTER_REFUSALS:
        refusal = make(*args)
        assert (refusal.code, refusal.message, refusal.close_code) == (code, message,
                                                                       close_code), make
        assert msgpack.unpackb(refusal.frame()) == {"type": "Error", "message": message,
                                                    "code": code}
