"""What each API key used, in the router's metrics, to bill or limit by: streams
admitted and seconds of audio sent per key, the labels bounded (past
``metrics.MAX_KEY_LABELS`` keys, ``other``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

from asrpool.common import auth, protocol
from asrpool.router import metrics
from tests.router import support
from tests.router.test_pods import router_metric
from tests.support.redis_servers import RedisServer

KEYS = {"team-a": "k-team-a", "team-b": "k-team-b"}


@pytest.fixture(scope="module")
def router(module_redis: RedisServer,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[support.RouterProcess]:
    workdir = tmp_path_factory.mktemp("keys")
    key_file = workdir / "keys.json"
    key_file.write_text(json.dumps({"keys": [{"id": key_id, "sha256": auth.hash_key(plain)}
                                             for key_id, plain in KEYS.items()]}))
    pod = support.pod(module_redis.url, workdir, "keyed-pod", 2)
    proc = support.router(module_redis.url, workdir, "--api-keys-file", str(key_file))
    try:
        pod.start()
        pod.wait_ready()
        proc.start()
        support.wait_until(lambda: support.pods_in_view(proc, key=KEYS["team-a"]) == 1, 20,
                           "the pod in view")
        yield proc
    finally:
        proc.kill()
        pod.stop()


async def test_each_keys_streams_and_audio_are_counted(router: support.RouterProcess) -> None:
    pcm = (np.sin(np.arange(24_000 * 2) / 9) * 0.2).astype(np.float32)
    sent = sum(len(m["pcm"]) for m in support.messages(pcm) if m["type"] == "Audio")
    for _ in range(2):
        await support.transcribe(router.ws_url, pcm,
                                 {protocol.API_KEY_HEADER: KEYS["team-a"]})
    await support.transcribe(router.ws_url, pcm, {protocol.API_KEY_HEADER: KEYS["team-b"]})

    def counted(name: str, key: str) -> float | None:
        return router_metric(router, f'asrpool_router_key_{name}_total{{key="{key}"}}')

    async def last_counted() -> bool:
        return counted("audio_seconds", "team-b") is not None

    await support.async_wait_until(last_counted, 10, "the last stream's audio counted")
    assert (counted("streams", "team-a"), counted("streams", "team-b")) == (2.0, 1.0)
    assert counted("audio_seconds", "team-a") == pytest.approx(2 * sent / 24_000)
    assert counted("audio_seconds", "team-b") == pytest.approx(sent / 24_000)


def test_key_labels_are_bounded() -> None:
    meters = metrics.Metrics()
    labels = [meters.key_label(f"key-{n}") for n in range(metrics.MAX_KEY_LABELS + 5)]
    assert labels[:metrics.MAX_KEY_LABELS] == [f"key-{n}" for n in range(metrics.MAX_KEY_LABELS)]
    assert set(labels[metrics.MAX_KEY_LABELS:]) == {metrics.OTHER_KEYS}
    assert meters.key_label("key-0") == "key-0"  # one seen before keeps its own
    assert meters.key_label("") == metrics.ANONYMOUS
