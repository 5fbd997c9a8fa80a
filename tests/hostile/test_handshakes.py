"""Nothing before authentication exhausts a pod's or a router's memory or CPU: request
heads, URLs and header counts are bounded, a head must be complete within the
handshake deadline, and a process holds a bounded number of connections. Each is
refused with a clear HTTP status, against the real processes.

Before: a router grew by 150 MiB on 150 MiB of unfinished headers (httptools buffers
any head), a 32 MiB query string cost 1.6 s of CPU, and half-open handshakes stayed
past 75 s.
"""

from __future__ import annotations

import socket
import time

from asrpool.common import limits, processes
from asrpool_harness.bench import attacks
from tests.hostile import conftest
from tests.support import servers

ANSWER_S = 10.0  # far over the 1 s handshake deadline: a bound, not a timing


def _pid(platform: conftest.Platform, endpoint: str) -> int:
    if endpoint == "pod":
        return platform.pod.pid
    assert platform.router.proc is not None
    return platform.router.proc.pid




def test_an_endless_request_head_is_431_and_costs_no_memory(
        platform: conftest.Platform, endpoint: str) -> None:
    pid = _pid(platform, endpoint)
    before = servers.live_rss_bytes(pid)
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Filler: " + b"a" * (64 << 20)
    answer = attacks.exchange(platform.address(endpoint), head, ANSWER_S)
    assert attacks.status_of(answer) == 431, answer[:200]
    assert b"request head over" in answer
    # 64 MiB sent; at most the head limit kept
    assert servers.live_rss_bytes(pid) - before < 16 << 20


def test_a_32_mib_query_is_refused_without_parsing_it(
        platform: conftest.Platform, endpoint: str) -> None:
    pid = _pid(platform, endpoint)
    cpu = processes.cpu_seconds(pid)
    request = b"GET /api/asr-streaming?auth_id=" + b"q" * (32 << 20) + b" HTTP/1.1\r\n\r\n"
    answer = attacks.exchange(platform.address(endpoint), request, ANSWER_S)
    assert attacks.status_of(answer) == 431, answer[:200]
    assert processes.cpu_seconds(pid) - cpu < 1.0  # was 1.6 s for the parse alone; 0.03 s here


def test_a_long_url_is_414_naming_the_limit(platform: conftest.Platform, endpoint: str) -> None:
    query = "x" * (limits.DEFAULT_MAX_URL_BYTES + 1)
    for upgrade in (False, True):
        path = f"/api/asr-streaming?pool={query}"
        request = (attacks.upgrade_request(path, platform.headers(endpoint)) if upgrade
                   else f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        answer = attacks.exchange(platform.address(endpoint), request, ANSWER_S)
        assert attacks.status_of(answer) == 414, answer[:200]
        assert f"over the limit of {limits.DEFAULT_MAX_URL_BYTES}".encode() in answer


def test_too_many_or_too_long_header_lines_are_431(
        platform: conftest.Platform, endpoint: str) -> None:
    many = {f"x-h{i}": "1" for i in range(limits.DEFAULT_MAX_HEADERS + 1)}
    long = {"x-long": "y" * limits.MAX_LINE_BYTES}
    for extra, says in ((many, b"header lines are over"), (long, b"a header line of")):
        request = attacks.upgrade_request(headers=platform.headers(endpoint) | extra)
        answer = attacks.exchange(platform.address(endpoint), request, ANSWER_S)
        assert attacks.status_of(answer) == 431, answer[:200]
        assert says in answer


def test_half_open_handshakes_are_408_after_the_deadline(
        platform: conftest.Platform, endpoint: str) -> None:
    socks = [attacks.connect(platform.address(endpoint)) for _ in range(10)]
    try:
        for i, sock in enumerate(socks):  # half of them send half a head, half nothing
            if i % 2:
                sock.sendall(b"GET /api/asr-streaming HTTP/1.1\r\nHost: x\r\n")
        answers = [attacks.read_all(sock, ANSWER_S) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    assert {attacks.status_of(a) for a in answers} == {408}, answers[0][:200]
    assert b"request head not complete within 1 s" in answers[0]


def test_connections_over_the_limit_are_503_at_once(
        platform: conftest.Platform, endpoint: str) -> None:
    socks = [attacks.connect(platform.address(endpoint))
             for _ in range(conftest.MAX_CONNECTIONS + 6)]
    try:
        answers = [attacks.read_all(sock, ANSWER_S) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    statuses = [attacks.status_of(a) for a in answers]
    assert set(statuses) == {408, 503}, statuses  # held until the deadline, or refused
    assert statuses.count(408) <= conftest.MAX_CONNECTIONS
    assert statuses.count(503) >= 6
    refused = answers[statuses.index(503)]
    assert f"over {conftest.MAX_CONNECTIONS} connections".encode() in refused


def test_a_client_sending_frames_before_the_101_is_refused_and_leaks_nothing(
        platform: conftest.Platform, endpoint: str) -> None:
    """RFC 6455 4.1: a client waits for the 101. The pod takes such frames; the router,
    which relays raw bytes after the hand-over, closes 1002 and releases the stream."""
    request = attacks.upgrade_request(headers=platform.headers(endpoint))
    sock = attacks.connect(platform.address(endpoint))
    try:
        sock.sendall(request + attacks.audio_frame() * 3)
        time.sleep(0.5)
        sock.shutdown(socket.SHUT_WR)
        answer = attacks.read_all(sock, ANSWER_S)
    finally:
        sock.close()
    assert attacks.status_of(answer) == 101
    platform.wait_settled(10)
    assert platform.key_streams() == 0


def test_no_compression_is_negotiated(platform: conftest.Platform, endpoint: str) -> None:
    """permessage-deflate offered (as browsers and the websockets library do) is declined
    by pod and router alike: a 16 KiB compressed frame could inflate to the 16 MiB frame
    limit of audio work. (The pod negotiated it.)"""
    offer = {**platform.headers(endpoint),
             "Sec-WebSocket-Extensions": "permessage-deflate; client_max_window_bits"}
    head = _upgraded_head(platform.address(endpoint), attacks.upgrade_request(headers=offer))
    assert attacks.status_of(head) == 101
    assert b"sec-websocket-extensions" not in head.lower()
    platform.wait_settled(10)


def test_a_page_elsewhere_cannot_stream_or_post(platform: conftest.Platform,
                                                endpoint: str) -> None:
    """A browser on another site's page sends its Origin: the upgrade and the POST are
    403 from the head, and a form's content type is 415; each names its setting. The
    server's own origin (the router's live page) streams. (All were let through.)"""
    address = platform.address(endpoint)
    foreign = {**platform.headers(endpoint), "Origin": "https://evil.example"}
    answer = attacks.exchange(address, attacks.upgrade_request(headers=foreign), ANSWER_S)
    assert attacks.status_of(answer) == 403 and b"--allowed-origins" in answer
    post = (b"POST /api/asr-streaming HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\n"
            b"Content-Length: 4\r\n%s\r\nRIFF")
    answer = attacks.exchange(address, post % (b"audio/wav", b"Origin: https://evil.example\r\n"),
                              ANSWER_S)
    assert attacks.status_of(answer) == 403
    answer = attacks.exchange(address, post % (b"text/plain", b""), ANSWER_S)
    assert attacks.status_of(answer) == 415 and b"--upload-content-types" in answer
    host = f"127.0.0.1:{address[1]}"
    own = {**platform.headers(endpoint), "Origin": f"http://{host}"}
    head = _upgraded_head(address, attacks.upgrade_request(headers=own, host=host))
    assert attacks.status_of(head) == 101
    platform.wait_settled(10)


def _upgraded_head(address: tuple[str, int], request: bytes) -> bytes:
    """The response head to an upgrade request; the connection then closes."""
    sock = attacks.connect(address, timeout=ANSWER_S)
    try:
        sock.sendall(request)
        return attacks.read_head(sock)
    finally:
        sock.close()
