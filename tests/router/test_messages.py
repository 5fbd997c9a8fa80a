"""Resume tokens and the refusals clients are told: pure functions."""

from __future__ import annotations

import msgpack
import pytest

from asrpool.router import admissions, placing, poolnames, settings, tokens


def test_a_minted_token_parses_back_and_hashes_stably() -> None:
    token = tokens.mint(tokens.new_session_id())
    parsed = tokens.parse(token.text)
    assert parsed == token and parsed.sha256 == token.sha256
    assert tokens.mint(token.session_id).text != token.text  # the secret is fresh


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "0" * 32,
        "0" * 32 + ".",
        "0" * 32 + ".short",
        "G" * 32 + "." + "a" * 43,
        "0" * 32 + "." + "a" * 43 + "\n",
        "0" * 31 + "." + "a" * 43,
    ],
)
def test_malformed_tokens_are_rejected(text: str) -> None:
    assert tokens.parse(text) is None


@pytest.mark.parametrize(
    "reason",
    ["busy", "unknown_pool", "key_limit", "queue_full", "key_queue_full", "bad_resume_token",
     "pod_gone"],
)
def test_every_refusal_is_a_kyutai_error_frame(reason: admissions.Reason) -> None:
    request = admissions.Request("pool-a", "team", 2, tokens.mint(tokens.new_session_id()), "c")
    config = settings.RouterSettings()
    refusal = placing.refusal_for(admissions.Refused(reason), request, config)
    body = msgpack.unpackb(refusal.frame())
    assert body["type"] == "Error" and body["message"] and body["code"]
    assert 1000 <= refusal.close_code < 1016 and refusal.close_code not in (1005, 1006)


def test_pool_names_are_kubernetes_names_scoped_by_namespace() -> None:
    assert poolnames.resolve("default", None) == "default"
    assert poolnames.resolve("stt-en.v2", "speech") == "speech/stt-en.v2"
    assert poolnames.resolve("team-b/stt", "speech") == "team-b/stt"
    for bad in ("", "A", "-a", "a-", "a:b", "a" * 254, "a b", "/a", "a/", "a/b/c", "a.b/c",
                "x" * 64 + "/a"):
        assert poolnames.resolve(bad, "speech") is None, bad
