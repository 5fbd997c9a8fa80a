"""moshi-server's HTTP routes on pods and routers: POST /api/asr-streaming (a whole
file in, the Word/EndWord list out), /api/build_info, /api/modules_info."""

from __future__ import annotations

import asyncio
import http.client
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sphn

from tests.compat import clients, conftest
from tests.server import reference
from tests.support import kyutai_client, streams


def _post(endpoint: conftest.Endpoint, body: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(endpoint.http_url + "/api/asr-streaming", data=body,
                                     headers={**endpoint.headers, "Content-Type": "audio/wav"},
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            import json

            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _moshi_post_words(pcm: np.ndarray) -> list[tuple[Any, ...]]:
    """moshi-server's handle_query: the audio, Marker 0, 10 s of silence."""
    return reference.words([{"type": "Audio", "pcm": pcm}, {"type": "Marker", "id": 0},
                            {"type": "Audio", "pcm": np.zeros(240_000, dtype=np.float32)}],
                           conftest.BATCH)


@pytest.mark.parametrize("kind", ["wav", "opus"])
async def test_post_a_file(endpoint: conftest.Endpoint, tmp_path: Path, kind: str) -> None:
    pcm = streams.random_speechlike(3.0, seed=11)
    path = tmp_path / f"clip.{kind}"
    (sphn.write_wav if kind == "wav" else sphn.write_opus)(
        str(path), pcm if kind == "wav" else pcm[None], clients.SECOND)
    status, words = await asyncio.to_thread(_post, endpoint, path.read_bytes())
    assert status == 200, words
    assert {w["type"] for w in words} <= {"Word", "EndWord"} and words
    if kind == "wav":  # 24 kHz PCM WAV: the same samples
        assert kyutai_client.words(words) == _moshi_post_words(pcm)
    await clients.used_slots_become(endpoint, 0, 5)


async def test_post_a_body_that_is_not_audio(endpoint: conftest.Endpoint) -> None:
    status, text = await asyncio.to_thread(_post, endpoint, b"this is not a sound file")
    assert status == 400 and "not a WAV" in text
    assert endpoint.used_slots() == 0


def test_build_info(endpoint: conftest.Endpoint) -> None:
    info = endpoint.get_json("/api/build_info")
    moshi_keys = {"build_timestamp", "build_date", "git_branch", "git_timestamp", "git_date",
                  "git_hash", "git_describe", "rustc_host_triple", "rustc_version",
                  "cargo_target_triple"}
    assert moshi_keys <= set(info) and all(isinstance(v, str) for v in info.values())


def test_modules_info(endpoint: conftest.Endpoint) -> None:
    (module,) = endpoint.get_json("/api/modules_info")
    assert module["type"] == "batched_asr" and module["path"] == "/api/asr-streaming"
    assert (module["total_slots"], module["used_slots"]) == (str(conftest.BATCH), "0")


def test_post_a_body_over_the_limit(endpoint: conftest.Endpoint) -> None:
    """Refused from its declared length (64 MiB limit), before it is read."""
    host, port = endpoint.http_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.putrequest("POST", "/api/asr-streaming")
    for name, value in {**endpoint.headers, "Content-Length": str(65 << 20),
                        "Content-Type": "audio/wav"}.items():
        connection.putheader(name, value)
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413 and b"exceeds the limit" in response.read()
    connection.close()
