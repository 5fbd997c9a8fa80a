"""``asrpool stream``'s client resumes its stream when its connection drops: through a
TCP proxy of the test's own that cuts every connection open (as a network or a load
balancer would), to a real router and pod."""

from __future__ import annotations

import asyncio
from pathlib import Path

from asrpool.client import streaming
from asrpool.common import audio, protocol
from tests.router import support
from tests.router.test_pods import running, wait_for_pods
from tests.support import streams
from tests.support.cutting import CuttingProxy
from tests.support.redis_servers import RedisServer


async def test_a_dropped_connection_resumes_and_the_transcript_is_whole(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    pod = support.pod(redis_server.url, tmp_path, "keeps", slots=2)
    router = support.router(redis_server.url, tmp_path)
    pcm = streams.random_speechlike(4.0, 21)
    with running(pod, router):
        wait_for_pods(router, 1)
        whole_sent: list[int] = []
        whole = await streaming.stream_messages(
            router.ws_url, audio.kyutai_file_messages(pcm, marker_id=streaming.MARKER_ID),
            rtf=4.0, on_sent=whole_sent.append)
        proxy = CuttingProxy(router.port)
        server = await proxy.serve()
        port = server.sockets[0].getsockname()[1]
        sent: list[int] = []
        cutting = asyncio.get_running_loop().call_later(1.2, proxy.cut)
        try:
            resumed = await streaming.stream_messages(
                f"ws://127.0.0.1:{port}{protocol.STREAMING_PATH}",
                audio.kyutai_file_messages(pcm, marker_id=streaming.MARKER_ID), rtf=4.0,
                on_sent=sent.append)
        finally:
            cutting.cancel()
            server.close()
        assert proxy.connections == 2  # the first cut, the resume
        assert resumed.marker_seen and whole.marker_seen
        assert resumed.words == whole.words  # nothing lost, nothing twice
        assert abs(sum(sent) - sum(whole_sent)) <= 2 * protocol.SAMPLE_RATE  # counted once
        assert pod.metric("asr_resumes_total") == 1


def test_a_resumed_stream_sends_its_audio_from_the_sample_the_server_holds() -> None:
    plan = [{"type": "Audio", "pcm": [0.0] * 10}, {"type": "Audio", "pcm": [1.0] * 10},
            {"type": "Marker", "id": 0}, {"type": "Audio", "pcm": [2.0] * 10}]
    assert list(streaming.from_sample(plan, 0)) == plan
    assert list(streaming.from_sample(plan, 15)) == [
        {"type": "Audio", "pcm": [1.0] * 5}, {"type": "Marker", "id": 0},
        {"type": "Audio", "pcm": [2.0] * 10}]
    assert list(streaming.from_sample(plan, 20)) == plan[2:]
    assert list(streaming.from_sample(plan, 25)) == [{"type": "Audio", "pcm": [2.0] * 5}]
