"""The API key file (``asrpool.common.auth``): a key's pools, and clear refusals of bad ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asrpool.common import auth


def _ring(tmp_path: Path, **entry: object) -> auth.KeyRing:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [{"id": "team", "sha256": "a" * 64, **entry}]}))
    return auth.load_keys(path)


def test_a_key_without_pools_may_use_every_pool(tmp_path: Path) -> None:
    (key,) = _ring(tmp_path).keys
    assert key.pools is None and key.allows("speech/stt") and key.allows("default")


def test_a_key_with_pools_may_use_those_and_its_namespaces_only(tmp_path: Path) -> None:
    (key,) = _ring(tmp_path, pools=["speech/stt-en", "research/*", "default"]).keys
    assert [key.allows(pool) for pool in (
        "speech/stt-en", "research/a", "research/b.c", "default",
        "speech/stt-fr", "research", "researchers/a", "other/stt-en")] == [
        True, True, True, True, False, False, False, False]
    assert key.refusal("speech/stt-fr") == (
        "API key team may not use pool speech/stt-fr (it may use: speech/stt-en, research/*, "
        "default)")


@pytest.mark.parametrize("pools", [[], "speech/stt", [1], ["Speech/stt"], ["speech/st*"],
                                   ["*"], ["a/b/c"]])
def test_a_bad_pools_list_is_refused_naming_the_key(tmp_path: Path, pools: object) -> None:
    with pytest.raises(auth.KeyFileError, match=r"keys\[0\]: 'pools' must be a non-empty list"):
        _ring(tmp_path, pools=pools)


def test_only_a_key_that_allows_browsers_is_found_as_a_browsers(tmp_path: Path) -> None:
    plain = "k-secret"
    for browsers in (True, False):
        ring = _ring(tmp_path, sha256=auth.hash_key(plain), browsers=browsers)
        assert ring.find(plain) is not None  # any other way, either key
        assert (ring.find_browsers(plain) is not None) is browsers


@pytest.mark.parametrize("browsers", ["yes", 1, None])
def test_a_browsers_flag_that_is_not_a_boolean_is_refused(tmp_path: Path,
                                                          browsers: object) -> None:
    with pytest.raises(auth.KeyFileError, match=r"keys\[0\]: 'browsers' must be true or false"):
        _ring(tmp_path, browsers=browsers)
