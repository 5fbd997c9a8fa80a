"""Resume tokens and the refusals clients are told: pure functions."""

from __future__ import annotations

import msgpack
import pytest

from asrpool.router import admissions, placing, poolnames, settings, tokens


@pytest.mark.parametrize("pool", ["default", "speech/stt-en.v2", "a"])
def test_a_minted_token_parses_back_with_its_pool_and_hashes_stably(pool: str) -> None:
    token = tokens.mint(pool, tokens.new_session_id())
    parsed = tokens.parse(token.text)
    assert parsed == token and parsed.sha256 == token.sha256 and parsed.pool == pool
    assert tokens.mint(pool, token.session_id).text != token.text  # the secret is fresh
    assert not tokens.is_old(token.text)


SID, SECRET = "0" * 32, "a" * 43


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "0" * 32,
        "0" * 32 + ".",
        "0" * 32 + ".short",
        "default." + "G" * 32 + "." + SECRET,
        f"default.{SID}.{SECRET}\n",
        "default." + "0" * 31 + "." + SECRET,
        f".{SID}.{SECRET}",  # no pool
        f"Default.{SID}.{SECRET}",  # not a pool name
        f"a/b/c.{SID}.{SECRET}",
        f"{{x}}.{SID}.{SECRET}",  # a brace would break the pool's slot
        f"{SID}.{SECRET}",  # a token from before the pool was in it
    ],
)
def test_malformed_tokens_are_rejected(text: str) -> None:
    assert tokens.parse(text) is None


def test_only_an_old_routers_shape_is_told_it_is_old() -> None:
    assert tokens.is_old(f"{SID}.{SECRET}")
    for text in ("garbage", f"default.{SID}.{SECRET}", f"{SID}.short", f"{SID}.{SECRET}.x"):
        assert not tokens.is_old(text), text


@pytest.mark.parametrize(
    "reason",
    ["busy", "unknown_pool", "key_limit", "queue_full", "key_queue_full", "bad_resume_token",
     "pod_gone"],
)
def test_every_refusal_is_a_kyutai_error_frame(reason: admissions.Reason) -> None:
    token = tokens.mint("pool-a", tokens.new_session_id())
    request = admissions.Request("pool-a", "team", 2, token, "c")
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
