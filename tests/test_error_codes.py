"""Error codes have one owner, ``protocol.ErrorCode``, and refusals one type,
``protocol.Refusal`` (the pod's and the router's): each code is documented, travels as a
plain MessagePack string, and a router maps a pod's unknown code to ``internal``."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import msgpack

from asrpool.common import protocol
from asrpool.router import refusals
from asrpool.server import outcomes

DOCS = Path(__file__).resolve().parents[1] / "docs" / "reference" / "protocol.md"


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
    # New with the Redis Cluster key layout: a resume token of an older router (no pool in
    # it) is told so, under the code of any other unusable token.
    (refusals.old_resume_token, (), "bad_resume_token", "resume token from before a router"
     " upgrade (it names no pool); start a new stream", 1008),
]


def test_every_router_refusal_is_what_clients_met_before() -> None:
    for make, args, code, message, close_code in ROUTER_REFUSALS:
        refusal = make(*args)
        assert (refusal.code, refusal.message, refusal.close_code) == (code, message,
                                                                       close_code), make
        assert msgpack.unpackb(refusal.frame()) == {"type": "Error", "message": message,
                                                    "code": code}


# Words that are error codes but mean something else where these modules write them.
_NOT_CODES = {
    "draining": "a pod's state and its heartbeat's field, not the Error's code",
    "overloaded": "the heartbeat's field and /api/modules_info's key, as draining",
    "too_large": "router/frames.py: a scanned frame's fault, told as refusals.too_large",
}
_PACKAGES = ("asrpool", "server", "router", "operator", "bench", "plan")
_ROOT = Path(__file__).resolve().parents[1]


def code_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string literal in ``source`` that is an error code."""
    codes = {code.value for code in protocol.ErrorCode}
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.STRING and _string(token.string) in codes:
            found.append((token.start[0], token.string))
    return found


def _string(text: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):  # an f-string's pieces
        return None


def test_the_scanner_finds_a_code_in_any_quotes_and_not_inside_text() -> None:
    source = "a = 'busy'\nb = \"key_limit\"\nc = 'busy now'\n# 'busy'\nd = f'busy'\n"
    assert code_literals(source) == [(1, "'busy'"), (2, '"key_limit"')]


def test_no_module_but_the_protocol_writes_an_error_code_as_a_string() -> None:
    owner = _ROOT / "asrpool" / "common" / "protocol.py"
    twins = [f"{path.relative_to(_ROOT)}:{line}: {text} (use protocol.ErrorCode)"
             for package in _PACKAGES for path in sorted((_ROOT / package).rglob("*.py"))
             if path != owner
             for line, text in code_literals(path.read_text())
             if _string(text) not in _NOT_CODES]
    assert twins == []
