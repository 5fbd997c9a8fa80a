"""A client that stops reading does not keep its slot (nor its API key's stream count):
sends to it have a deadline, on the pod and through the router's byte relay.

The client is a raw socket with the kernel's smallest receive buffer that handshakes,
sends audio as fast as it is taken and never reads a byte. Without a deadline it kept
its slot for as long as it kept sending: the pod's writes waited for ever.
"""

from __future__ import annotations

from asrpool_harness.bench import attacks
from tests.hostile import conftest
from tests.router import support

SENDING_S = 60.0  # it would send this long; the deadline cuts it long before


def _counted(url: str, sample: str) -> float:
    status, body = support.http_get(url + "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[1])
    return 0.0


def _too_slow_count(platform: conftest.Platform, endpoint: str) -> float:
    if endpoint == "pod":
        return _counted(platform.pod.http_url, 'asr_errors_total{code="too_slow"}')
    return _counted(platform.router.url, 'asrpool_router_rejections_total{reason="too_slow"}')


def test_a_client_that_never_reads_is_cut_and_its_slot_freed(
        platform: conftest.Platform, endpoint: str) -> None:
    before = _too_slow_count(platform, endpoint)
    streamed = attacks.stream_without_reading(
        platform.address(endpoint), platform.headers(endpoint), SENDING_S)
    assert streamed.cut, f"still connected after {streamed.frames_sent} frames"
    platform.wait_settled(10)
    assert platform.key_streams() == 0
    assert _too_slow_count(platform, endpoint) == before + 1
