"""The router with real server pods (``asrpool serve --model tiny``), real router
processes and a real Redis: admission under a crowd, pod and router failures, Redis
loss, draining, placement, queueing and oversized frames."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import sphn
import websockets
import websockets.asyncio.client

from asrpool.common import protocol, seeds
from tests.router import support
from tests.support import kyutai_client, servers, streams
from tests.support.redis_servers import RedisServer


@contextlib.contextmanager
def running(*procs: Any) -> Iterator[None]:
    """Start pods and routers (pods first, all at once), stop them all at the end."""
    pods = [p for p in procs if isinstance(p, servers.ServerProcess)]
    routers = [p for p in procs if isinstance(p, support.RouterProcess)]
    try:
        for p in pods:
            p.start()
        for p in pods:
            p.wait_ready()
        for r in routers:
            r.start()
        yield
    finally:
        for r in routers:
            r.kill()
        for p in pods:
            if p.poll() is None:
                p.signal(signal.SIGKILL)
                p.wait(10)


def pools(router: support.RouterProcess) -> dict[str, Any]:
    status, body = support.http_get(router.url + "/api/pools")
    assert status == 200, body
    return dict(json.loads(body)["pools"])


def pod_view(router: support.RouterProcess, pool: str = "default") -> dict[str, dict[str, Any]]:
    return {p["pod_id"]: p for p in pools(router).get(pool, {"pods": []})["pods"]}


def wait_for_pods(router: support.RouterProcess, count: int, pool: str = "default") -> None:
    support.wait_until(lambda: len(pod_view(router, pool)) == count, 20, f"{count} pods")


def settled(router: support.RouterProcess) -> bool:
    """Every pod's heartbeat agrees with the routers' sessions (nothing double counted)."""
    view = pod_view(router).values()
    return all(p["free_slots"] == p["total_slots"] - p["router_sessions"] for p in view) and all(
        p["reported_free_slots"] == p["free_slots"] for p in view
    )


def audio(seed: int, seconds: float = 2.0) -> np.ndarray:
    return streams.random_speechlike(seconds, seed)


async def test_forty_clients_four_routers_three_pods(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Exactly 12 admitted, no pod over its 4 slots (no pod ever refused a stream the
    router sent it), the rest refused with busy; every admitted stream gets the words
    it gets alone."""
    pods = [support.pod(redis_server.url, tmp_path, f"pod-{i}", slots=4) for i in range(3)]
    routers = [support.router(redis_server.url, tmp_path) for _ in range(4)]
    with running(*pods, *routers):
        wait_for_pods(routers[0], 3)
        alone = {
            seed: await support.transcribe(routers[0].ws_url, audio(seed)) for seed in range(3)
        }
        support.wait_until(lambda: settled(routers[0]), 20, "slots to settle")
        answered = 0
        everyone_answered = asyncio.Event()

        async def client(i: int) -> tuple[str, list[dict[str, Any]]]:
            nonlocal answered
            opened = await support.connect(routers[i % 4].ws_url)
            first = await support.first_message(opened.ws)
            answered += 1
            if answered == 40:
                everyone_answered.set()
            if first["type"] == "Error":
                assert first["code"] == "busy"
                await support.until_closed(opened.ws)
                return "busy", []
            assert first["type"] == "Ready"
            await everyone_answered.wait()  # hold the slot until every client was answered
            try:
                return "ok", await support.finish_stream(opened.ws, audio(i % 3))
            finally:
                await opened.ws.close()

        async def sample_use() -> list[int]:
            await everyone_answered.wait()
            return [p.modules_info()["used_slots"] for p in pods]

        results, use = await asyncio.gather(
            asyncio.gather(*(client(i) for i in range(40))), sample_use()
        )
        outcomes = collections.Counter(kind for kind, _ in results)
        assert outcomes == {"ok": 12, "busy": 28}
        assert use == [4, 4, 4]
        for i, (kind, messages) in enumerate(results):
            if kind == "ok":
                assert kyutai_client.words(messages) == kyutai_client.words(alone[i % 3])
        for p in pods:
            assert p.metric('asr_errors_total{code="busy"}') is None  # the router never over-sent


async def stream_until_marker_or_close(
    ws: websockets.asyncio.client.ClientConnection, pcm: np.ndarray, realtime: float
) -> tuple[list[dict[str, Any]], int | None]:
    """A file-client session paced at ``realtime``: every message up to the marker (close
    code None) or up to the server's close (its code)."""
    sender = asyncio.create_task(kyutai_client.send_paced(ws, support.messages(pcm), realtime))
    out: list[dict[str, Any]] = []
    try:
        while True:
            out.append(msgpack.unpackb(await asyncio.wait_for(ws.recv(decode=False), 60)))
            if support.is_marker(out[-1]):
                return out, None
    except websockets.ConnectionClosed:
        return out, ws.close_code
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)


def times(messages: list[dict[str, Any]]) -> list[float]:
    return [m.get("start_time", m.get("stop_time")) for m in messages
            if m["type"] in ("Word", "EndWord")]


async def test_a_killed_pods_streams_move_where_there_is_room_and_end_where_there_is_none(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Two streams on a pod that is SIGKILLed, one slot free elsewhere: one stream goes
    on on the other pod on the same socket (no Error, no close, its marker back, its
    word times going on from where it was), the other is told pod_lost; a third stream,
    on the other pod all along, carries on."""
    a = support.pod(redis_server.url, tmp_path, "a-pod", slots=2)
    b = support.pod(redis_server.url, tmp_path, "b-pod", slots=2)
    router = support.router(redis_server.url, tmp_path, "--policy", "pack")
    with running(a, b, router):
        wait_for_pods(router, 2)
        doomed = [await support.connect(router.ws_url) for _ in range(2)]  # pack: both on a-pod
        for c in doomed:
            assert (await support.first_message(c.ws))["type"] == "Ready"
        survivor = await support.connect(router.ws_url)
        assert (await support.first_message(survivor.ws))["type"] == "Ready"
        assert a.modules_info()["used_slots"] == 2 and b.modules_info()["used_slots"] == 1
        surviving = asyncio.create_task(support.finish_stream(survivor.ws, audio(1), realtime=4.0))
        streams = [asyncio.create_task(stream_until_marker_or_close(c.ws, audio(3 + i, 4.0), 1.0))
                   for i, c in enumerate(doomed)]
        await asyncio.sleep(2.5)
        a.signal(signal.SIGKILL)
        (moved, kept), (lost, code) = sorted(await asyncio.gather(*streams),
                                             key=lambda got: got[1] or 0)
        assert kept is None and not [m for m in moved if m["type"] == "Error"], moved
        assert times(moved) == sorted(times(moved)), times(moved)  # never back
        assert times(moved) and times(moved)[-1] > 2.0  # on the stream's clock, not the new pod's
        assert max(times(moved)) <= 4.0 + 1.5 + 0.2  # within the audio sent
        assert (lost[-1]["code"], code) == ("pod_lost", 1011), lost
        assert kyutai_client.words(await surviving) != []
        await survivor.ws.close()
        for c in doomed:
            await c.ws.close()
        assert router_metric(router, 'asrpool_router_streams_moved_total{outcome="moved"}') == 1
        assert router_metric(router, 'asrpool_router_streams_moved_total{outcome="failed"}') == 1
        newcomer = await support.transcribe(router.ws_url, audio(2))
        assert support.is_marker(newcomer[-1])


async def test_a_stream_past_its_pods_drain_grace_moves_to_another_pod(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The pod's drain Error is held back, the stream goes on elsewhere, unbroken."""
    grace = ("--drain-grace-seconds", "1")
    a = support.pod(redis_server.url, tmp_path, "a-pod", 2, "default", *grace)
    b = support.pod(redis_server.url, tmp_path, "b-pod", 2, "default", *grace)
    router = support.router(redis_server.url, tmp_path, "--policy", "pack")
    with running(a, b, router):
        wait_for_pods(router, 2)
        opened = await support.connect(router.ws_url)
        assert (await support.first_message(opened.ws))["type"] == "Ready"
        draining = a if a.modules_info()["used_slots"] == 1 else b
        streaming = asyncio.create_task(stream_until_marker_or_close(opened.ws, audio(9, 4.0), 1.0))
        await asyncio.sleep(1.5)
        draining.signal(signal.SIGTERM)
        messages, closed = await streaming
        assert closed is None and not [m for m in messages if m["type"] == "Error"], messages
        assert times(messages) == sorted(times(messages))
        await opened.ws.close()
        assert draining.wait(20) == 0
        assert router_metric(router, 'asrpool_router_streams_moved_total{outcome="moved"}') == 1


async def test_a_marker_its_lost_pod_had_not_answered_comes_back_from_the_next(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A marker sent just before its pod is SIGKILLed: the new pod is sent it again, and
    the client gets it back (a client waiting for its marker would wait for ever)."""
    a = support.pod(redis_server.url, tmp_path, "a-pod", slots=1)
    b = support.pod(redis_server.url, tmp_path, "b-pod", slots=1)
    router = support.router(redis_server.url, tmp_path)
    with running(a, b, router):
        wait_for_pods(router, 2)
        opened = await support.connect(router.ws_url)
        assert (await support.first_message(opened.ws))["type"] == "Ready"
        pcm = audio(12, seconds=2.0)
        await kyutai_client.send_paced(opened.ws, support.messages(pcm)[:-4], realtime=1.0)
        await opened.ws.send(kyutai_client.pack({"type": "Marker", "id": 5}))
        (a if a.modules_info()["used_slots"] else b).signal(signal.SIGKILL)
        silence = [{"type": "Audio", "pcm": np.zeros(1920, dtype=np.float32)}] * 40
        sender = asyncio.create_task(kyutai_client.send_paced(opened.ws, silence, 1.0))
        got = await kyutai_client.until_marker(opened.ws, 5, timeout=30)
        await sender
        await opened.ws.close()
        assert [m["id"] for m in got if m["type"] == "Marker"] == [5]
        assert router_metric(router, 'asrpool_router_streams_moved_total{outcome="moved"}') == 1


async def test_a_stream_moves_again_when_its_second_pod_drains(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Killed off its first pod, drained off its second: one unbroken stream, on its own
    clock all along, on the third."""
    grace = ("--drain-grace-seconds", "1")
    pods = [support.pod(redis_server.url, tmp_path, f"pod-{i}", 1, "default", *grace)
            for i in range(3)]
    router = support.router(redis_server.url, tmp_path)
    with running(*pods, router):
        wait_for_pods(router, 3)
        opened = await support.connect(router.ws_url)
        assert (await support.first_message(opened.ws))["type"] == "Ready"
        streaming = asyncio.create_task(stream_until_marker_or_close(opened.ws, audio(5, 6.0), 1.0))

        def serving() -> servers.ServerProcess:
            return next(p for p in pods if p.poll() is None and p.modules_info()["used_slots"])

        await asyncio.sleep(1.5)
        serving().signal(signal.SIGKILL)
        await asyncio.sleep(2.0)
        serving().signal(signal.SIGTERM)
        messages, closed = await streaming
        assert closed is None and not [m for m in messages if m["type"] == "Error"], messages
        assert times(messages) == sorted(times(messages))
        await opened.ws.close()
        assert router_metric(router, 'asrpool_router_streams_moved_total{outcome="moved"}') == 2


def router_metric(router: support.RouterProcess, sample: str) -> float | None:
    status, body = support.http_get(router.url + "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[1])
    return None


async def test_router_killed_mid_stream_resumes_through_another(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A client of a SIGKILLed router reconnects to another router with its resume token,
    lands on the same pod and slot, and its transcript is the one it gets alone."""
    pod = support.pod(redis_server.url, tmp_path, "only", slots=2)
    first, second = (support.router(redis_server.url, tmp_path) for _ in range(2))
    with running(pod, first, second):
        wait_for_pods(first, 1)
        pcm = audio(7, seconds=3.0)
        alone = await support.transcribe(first.ws_url, pcm)
        messages = support.messages(pcm)
        half = len(messages) // 2
        opened = await support.connect(first.ws_url)
        assert opened.resume_token
        got = [await support.first_message(opened.ws)]
        await kyutai_client.send_paced(opened.ws, messages[:half])
        got += await _quiet(opened.ws)  # let the pod work through what it has
        first.kill()
        with contextlib.suppress(websockets.ConnectionClosed):
            await opened.ws.recv()
        again = await support.connect(
            second.ws_url, {protocol.RESUME_TOKEN_HEADER: opened.resume_token}
        )
        assert again.session_id == opened.session_id
        offset = int(again.ws.response.headers["asrpool-resume-offset"])  # type: ignore[union-attr]
        assert offset == sum(len(m["pcm"]) for m in messages[:half] if m["type"] == "Audio")
        assert (await support.first_message(again.ws))["type"] == "Ready"
        sender = asyncio.create_task(kyutai_client.send_paced(again.ws, messages[half:]))
        got += await kyutai_client.until_marker(again.ws, 0, timeout=60)
        await sender
        await again.ws.close()
        assert kyutai_client.words(got) == kyutai_client.words(alone)
        assert pod.metric("asr_resumes_total") == 1


async def test_a_moved_stream_resumes_through_another_router_on_its_own_clock(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Moved off a SIGKILLed pod, then its router SIGKILLed: the client resumes through
    another router, told to send again from the audio both pods had taken together, and
    the new pod's steps go on on the stream's clock, none sent twice or going back."""
    a = support.pod(redis_server.url, tmp_path, "a-pod", slots=1)
    b = support.pod(redis_server.url, tmp_path, "b-pod", slots=1)
    first, second = (support.router(redis_server.url, tmp_path) for _ in range(2))
    with running(a, b, first, second):
        wait_for_pods(first, 2)
        messages = support.messages(audio(11, seconds=6.0))
        third = len(messages) // 3
        opened = await support.connect(first.ws_url, {protocol.RESUMABLE_HEADER: "1"})
        got = [await support.first_message(opened.ws)]
        await kyutai_client.send_paced(opened.ws, messages[:third])
        got += await _quiet(opened.ws)
        (a if a.modules_info()["used_slots"] else b).signal(signal.SIGKILL)
        moved = 'asrpool_router_streams_moved_total{outcome="moved"}'
        await asyncio.to_thread(support.wait_until, lambda: router_metric(first, moved) == 1,
                                20, "the stream moved")
        await kyutai_client.send_paced(opened.ws, messages[third:2 * third])
        got += await _quiet(opened.ws)
        first.kill()
        with contextlib.suppress(websockets.ConnectionClosed):
            await opened.ws.recv()
        again = await support.connect(second.ws_url, {
            protocol.RESUME_TOKEN_HEADER: opened.resume_token,
            protocol.RESUME_RECEIVED_HEADER: str(sum(m["type"] != "Ready" for m in got)),
        })
        offset = int(again.ws.response.headers[protocol.RESUME_OFFSET_HEADER])  # type: ignore[union-attr]
        assert offset == sum(len(m["pcm"]) for m in messages[:2 * third] if m["type"] == "Audio")
        assert (await support.first_message(again.ws))["type"] == "Ready"
        sender = asyncio.create_task(kyutai_client.send_paced(again.ws, messages[2 * third:]))
        got += await kyutai_client.until_marker(again.ws, 0, timeout=60)
        await sender
        await again.ws.close()
        steps = [m["step_idx"] for m in got if m["type"] == "Step"]
        assert steps == sorted(set(steps)), steps  # on, never back, none twice
        # The 6 s before the marker are 75 steps of the stream's, of which b-pod took 50.
        assert steps[-1] >= 70, steps
        assert times(got) == sorted(times(got))


async def _quiet(ws: Any, quiet_s: float = 1.5) -> list[dict[str, Any]]:
    """Every message until none came for ``quiet_s``."""
    out = []
    while True:
        try:
            out.append(await kyutai_client.receive(ws, quiet_s))
        except TimeoutError:
            return out


async def test_redis_killed_and_restarted_mid_stream(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Open streams never stop; admission fails fast with a clear Error while Redis is
    down, and recovers by itself once the pods' heartbeats have refilled it."""
    pod = support.pod(redis_server.url, tmp_path, "steady", slots=2)
    router = support.router(redis_server.url, tmp_path)
    with running(pod, router):
        wait_for_pods(router, 1)
        pcm = audio(3, seconds=3.0)
        alone = await support.transcribe(router.ws_url, pcm)
        opened = await support.connect(router.ws_url)
        assert (await support.first_message(opened.ws))["type"] == "Ready"
        streaming = asyncio.create_task(support.finish_stream(opened.ws, pcm, realtime=2.0))
        redis_server.kill()
        refused = await support.connect(router.ws_url)
        error = await support.first_message(refused.ws)
        assert error["type"] == "Error" and error["code"] == "unavailable"
        assert support.http_get(router.url + "/readyz")[0] == 503
        redis_server.start()
        assert kyutai_client.words(await streaming) == kyutai_client.words(alone)
        await opened.ws.close()
        support.wait_until(lambda: support.http_get(router.url + "/readyz")[0] == 200, 20, "ready")
        await support.async_wait_until(lambda: _admitted(router.ws_url), 30, "admission to recover")


async def _admitted(url: str) -> bool:
    opened = await support.connect(url)
    first = await support.first_message(opened.ws)
    await opened.ws.close()
    return bool(first["type"] == "Ready")


async def test_draining_pod_gets_no_new_sessions(redis_server: RedisServer, tmp_path: Path) -> None:
    draining = support.pod(
        redis_server.url, tmp_path, "a-drains", 2, "default", "--drain-grace-seconds", "60"
    )
    other = support.pod(redis_server.url, tmp_path, "b-stays", slots=2)
    router = support.router(redis_server.url, tmp_path, "--policy", "pack")
    with running(draining, other, router):
        wait_for_pods(router, 2)
        old = await support.connect(router.ws_url)  # pack, tie: the smallest id, a-drains
        assert (await support.first_message(old.ws))["type"] == "Ready"
        assert draining.modules_info()["used_slots"] == 1
        draining.signal(signal.SIGTERM)
        support.wait_until(lambda: pod_view(router)["a-drains"]["draining"], 10, "draining beat")
        for _ in range(2):  # pack would have put these on a-drains (it has room)
            new = await support.connect(router.ws_url)
            assert (await support.first_message(new.ws))["type"] == "Ready"
            await new.ws.close()
            assert draining.modules_info()["used_slots"] == 1
        assert other.metric("asr_connect_total") == 2
        finished = await support.finish_stream(old.ws, audio(4))
        assert support.is_marker(finished[-1])
        await old.ws.close()


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("pack", ["a", "a", "b", "b", "c", "c"]), ("spread", ["a", "b", "c", "a", "b", "c"])],
)
async def test_placement_policies(
    redis_server: RedisServer, tmp_path: Path, policy: str, expected: list[str]
) -> None:
    pods = {name: support.pod(redis_server.url, tmp_path, name, slots=2) for name in "abc"}
    router = support.router(redis_server.url, tmp_path, "--policy", policy)
    with running(*pods.values(), router):
        wait_for_pods(router, 3)
        held, placed = [], []
        for _ in expected:
            before = {n: p.metric("asr_connect_total") or 0 for n, p in pods.items()}
            opened = await support.connect(router.ws_url)
            assert (await support.first_message(opened.ws))["type"] == "Ready"
            held.append(opened)
            after = {n: p.metric("asr_connect_total") or 0 for n, p in pods.items()}
            placed += [n for n in pods if after[n] > before[n]]
            support.wait_until(lambda: settled(router), 20, "heartbeats to report the stream")
        assert placed == expected
        for opened in held:
            await opened.ws.close()


async def test_bounded_queue_wait_then_admission(redis_server: RedisServer, tmp_path: Path) -> None:
    pod = support.pod(redis_server.url, tmp_path, "single", slots=1)
    router = support.router(redis_server.url, tmp_path, "--queue-timeout-seconds", "20")
    with running(pod, router):
        wait_for_pods(router, 1)
        holder = await support.connect(router.ws_url)
        assert (await support.first_message(holder.ws))["type"] == "Ready"
        waiter = asyncio.create_task(support.connect(router.ws_url))
        await support.async_wait_until(lambda: _waiting(router), 10, "a waiter in the queue")
        assert not waiter.done()
        await holder.ws.close()
        opened = await waiter
        assert (await support.first_message(opened.ws))["type"] == "Ready"
        await opened.ws.close()


async def _waiting(router: support.RouterProcess) -> bool:
    return bool(pools(router)["default"]["waiting"] == 1)


async def test_oversized_frame_and_pod_token(redis_server: RedisServer, tmp_path: Path) -> None:
    """An oversized frame ends that stream with too_large and nothing else; a client that
    bypasses the router (no pod token) is refused by the pod."""
    pod = support.pod(redis_server.url, tmp_path, "guarded", slots=2)
    router = support.router(redis_server.url, tmp_path)
    with running(pod, router):
        wait_for_pods(router, 1)
        with pytest.raises(websockets.InvalidStatus) as caught:
            await support.connect(pod.ws_url)
        assert caught.value.response.status_code == 401
        bystander = await support.connect(router.ws_url)
        assert (await support.first_message(bystander.ws))["type"] == "Ready"
        big = await support.connect(router.ws_url)
        assert (await support.first_message(big.ws))["type"] == "Ready"
        with contextlib.suppress(websockets.ConnectionClosed):  # refused from its header
            await big.ws.send(b"\x00" * (protocol.DEFAULT_MAX_MESSAGE_BYTES + 1))
        told = await support.until_closed(big.ws)
        assert told[-1]["code"] == "too_large" and big.ws.close_code == 1009
        finished = await support.finish_stream(bystander.ws, audio(5))
        assert support.is_marker(finished[-1])
        await bystander.ws.close()


async def test_a_hung_pod_is_given_up_when_its_heartbeat_lapses(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A pod that stops (no FIN, no heartbeat) ends its streams with pod_lost."""
    pod = support.pod(redis_server.url, tmp_path, "hangs", slots=2)
    router = support.router(redis_server.url, tmp_path)
    with running(pod, router):
        wait_for_pods(router, 1)
        opened = await support.connect(router.ws_url)
        assert (await support.first_message(opened.ws))["type"] == "Ready"
        pod.signal(signal.SIGSTOP)
        try:
            told = await support.until_closed(opened.ws, timeout=30)
        finally:
            pod.signal(signal.SIGCONT)
        assert told[-1]["code"] == "pod_lost" and opened.ws.close_code == 1011


async def test_a_router_past_its_drain_grace_hands_its_streams_back_resumable(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    pod = support.pod(redis_server.url, tmp_path, "stays", slots=2)
    # The first at info: its log shows how far its shutdown got (once, in CI, it did
    # not end within terminate's 20 s and was killed; never seen since).
    first = support.router(redis_server.url, tmp_path, "--log-level", "info",
                           "--drain-grace-seconds", "1")
    second = support.router(redis_server.url, tmp_path)
    with running(pod, first, second):
        wait_for_pods(first, 1)
        opened = await support.connect(first.ws_url)
        assert (await support.first_message(opened.ws))["type"] == "Ready"
        # In a thread: this loop must answer the router's close handshake meanwhile
        # (blocked, it left the router waiting out its close timeout, killed once).
        stopped = await asyncio.to_thread(first.terminate)
        assert stopped == 0, first.log()
        told = await support.until_closed(opened.ws)
        assert told[-1]["type"] == "Error" and told[-1]["code"] == "draining", told
        assert "resume this stream with its resume token" in told[-1]["message"]
        assert opened.ws.close_code == 1012
        again = await support.connect(
            second.ws_url, {protocol.RESUME_TOKEN_HEADER: opened.resume_token}
        )
        assert (await support.first_message(again.ws))["type"] == "Ready"
        finished = await support.finish_stream(again.ws, audio(6))
        assert support.is_marker(finished[-1])
        await again.ws.close()
        assert pod.metric("asr_resumes_total") == 1


async def test_a_draining_router_relays_its_open_streams_and_takes_no_new_ones(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """SIGTERM: not ready, new streams and uploads told to go elsewhere, the open stream
    relayed to its end, and the router gone once it ends (well within the grace)."""
    pod = support.pod(redis_server.url, tmp_path, "serves", slots=2)
    router = support.router(redis_server.url, tmp_path, "--drain-grace-seconds", "60")
    with running(pod, router):
        wait_for_pods(router, 1)
        opened = await support.connect(router.ws_url)
        assert (await support.first_message(opened.ws))["type"] == "Ready"
        assert router.proc is not None
        router.proc.send_signal(signal.SIGTERM)
        support.wait_until(lambda: support.http_get(router.url + "/readyz")[0] == 503, 10,
                           "readiness 503")
        assert json.loads(support.http_get(router.url + "/readyz")[1])["sessions"] == 1
        late = await support.connect(router.ws_url)
        told = await support.until_closed(late.ws)
        assert (told[-1]["code"], late.ws.close_code) == ("draining", 1013), told
        upload = urllib.request.Request(router.url + protocol.STREAMING_PATH, b"RIFF",
                                        {"Content-Type": "audio/wav"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(upload, timeout=5)
        assert refused.value.code == 503
        assert b"shutting down" in refused.value.read()
        finished = await support.finish_stream(opened.ws, audio(11))
        assert support.is_marker(finished[-1]), finished
        assert not any(m["type"] == "Error" for m in finished)
        await opened.ws.close()
        assert await asyncio.to_thread(router.proc.wait, 20) == 0, router.log()


async def test_backpressure_bounds_what_the_router_holds(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """With the pod not reading (stopped), a client blasting audio is held back: its
    sends stop completing after a bounded amount (socket buffers), and the router's
    memory does not grow with what the client tries to send."""
    pod = support.pod(
        redis_server.url, tmp_path, "stalls", 1, "default", "--max-buffer-seconds", "1"
    )
    router = support.router(redis_server.url, tmp_path)
    with running(pod, router):
        wait_for_pods(router, 1)
        opened = await support.connect(router.ws_url)
        assert (await support.first_message(opened.ws))["type"] == "Ready"
        second = kyutai_client.audio(np.zeros(kyutai_client.SAMPLE_RATE, dtype=np.float32))
        rss_before = _rss(router)
        pod.signal(signal.SIGSTOP)
        sent = 0
        try:
            while sent < 256 << 20:
                try:
                    await asyncio.wait_for(opened.ws.send(second), 2.0)
                except TimeoutError:
                    break
                sent += len(second)
            rss_after = _rss(router)
        finally:
            pod.signal(signal.SIGCONT)
        assert sent < 64 << 20, f"{sent} bytes went somewhere"
        assert rss_after - rss_before < 32 << 20
        opened.ws.transport.abort()


def _rss(router: support.RouterProcess) -> int:
    assert router.proc is not None
    return servers.live_rss_bytes(router.proc.pid)


async def test_a_seeded_router_sends_each_pool_its_own_pod_token(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A pod holding another namespace's token (its Secret read, or copied) is never
    reached with it: the router sends each pool the token derived for that pool, for
    streams and for uploads."""
    seed = "chart-seed"
    ours = support.pod(redis_server.url, tmp_path, "ours", 1, "speech/stt",
                       token=seeds.pod_token(seed, "speech/stt"))
    stolen = support.pod(redis_server.url, tmp_path, "stolen", 1, "team-b/stt",
                         token=seeds.pod_token(seed, "speech/stt"))
    router = support.RouterProcess(redis_server.url, tmp_path, "--pod-attempts", "1",
                                   env={"ASRPOOL_POD_TOKEN_SEED": seed})
    with running(ours, stolen, router):
        wait_for_pods(router, 1, "speech/stt")
        wait_for_pods(router, 1, "team-b/stt")
        opened = await support.connect(router.ws_url + "?pool=speech/stt")
        assert (await support.first_message(opened.ws))["type"] == "Ready"
        await opened.ws.close()
        refused = await support.connect(router.ws_url + "?pool=team-b/stt")
        told = await support.first_message(refused.ws)
        assert (told["type"], told["code"]) == ("Error", "busy")
        assert stolen.modules_info()["used_slots"] == 0
        clip = tmp_path / "one-second.wav"
        sphn.write_wav(str(clip), np.zeros((1, kyutai_client.SAMPLE_RATE), np.float32),
                       kyutai_client.SAMPLE_RATE)
        status, text = await asyncio.to_thread(
            servers.post_file, router.url + "/pools/team-b/stt", clip.read_bytes())
        assert (status, stolen.modules_info()["used_slots"]) == (503, 0), text


async def test_pools_of_one_name_in_two_namespaces_never_mix(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The operator registers pods as ``namespace/name``; a bare name means the router's
    namespace, ``namespace/name`` (query or path) any other."""
    ours = support.pod(redis_server.url, tmp_path, "ours", 1, "speech/stt")
    theirs = support.pod(redis_server.url, tmp_path, "theirs", 1, "team-b/stt")
    router = support.router(redis_server.url, tmp_path, "--pool-namespace", "speech",
                            "--default-pool", "stt")
    with running(ours, theirs, router):
        wait_for_pods(router, 1, "speech/stt")
        wait_for_pods(router, 1, "team-b/stt")
        base = f"ws://127.0.0.1:{router.port}"
        for url, busy, idle in [
            (router.ws_url, ours, theirs),  # the default pool, in the router's namespace
            (router.ws_url + "?pool=stt", ours, theirs),
            (router.ws_url + "?pool=team-b/stt", theirs, ours),
            (f"{base}/pools/team-b/stt/api/asr-streaming", theirs, ours),
        ]:
            opened = await support.connect(url)
            assert (await support.first_message(opened.ws))["type"] == "Ready", url
            assert (busy.modules_info()["used_slots"], idle.modules_info()["used_slots"]) \
                == (1, 0), url
            await opened.ws.close()
            busy.wait_idle()
        opened = await support.connect(router.ws_url + "?pool=team-c/stt")
        refused = await support.first_message(opened.ws)
        assert (refused["type"], refused["code"]) == ("Error", "unknown_pool")
        assert "team-c/stt" in refused["message"]
