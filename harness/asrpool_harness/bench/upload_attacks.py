"""Attacks that try to make a little input cost a lot, for ``asrpool bench soak``.

- ``upload_bomb``: POSTed Ogg Opus files of empty 120 ms packets, under 1 MB each, that
  declare hours of audio (refused with 413 before they are decoded);
- ``opus_bomb``: the same hours in one ``OggOpus`` websocket message, in pages of 4.8 s
  (decoded only as far as the slot's buffer has room), held open for a while, closed;
- ``abandoned_upload``: POSTs of minutes of audio whose clients go away once the pod
  has taken a slot for them (the slot must come back at once, at pod and router);
- ``slow_body``: POSTs whose body stops coming, or trickles under the minimum pace
  (HTTP 408 at the body deadline; nothing held after it).

Each runs on blocking sockets in threads (the upload ones) or one websocket client, and
reports what the target answered; the soak adds the neighbour's latency and the pod's
and router's memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import socket
import time
import wave
from collections.abc import Callable
from typing import Any

import msgpack
import websockets
from websockets.asyncio import client as ws_client

from asrpool.bench import oggfiles
from asrpool.common import oggopus, protocol
from asrpool_harness.bench import attacks

_WAV_RATE = 8_000  # abandoned uploads: small files of long audio (the pod resamples)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bomb-hours", type=float, default=10.0,
                        help="audio each Opus bomb declares")
    parser.add_argument("--upload-bombs", type=int, default=4, help="POSTed at once")
    parser.add_argument("--opus-bomb-seconds", type=float, default=10.0,
                        help="how long the websocket bomb's stream is held open")
    parser.add_argument("--abandoned-uploads", type=int, default=4)
    parser.add_argument("--abandoned-seconds", type=float, default=600.0,
                        help="audio in each abandoned upload")
    parser.add_argument("--slow-bodies", type=int, default=4, help="half stalled, half slow")
    parser.add_argument("--body-timeout-seconds", type=float, default=5.0,
                        help="the pod's and router's (default theirs: 60)")


# The bodies


def opus_bomb(hours: float, frames: int = 6, per_page: int = 255) -> bytes:
    """An Ogg Opus file of empty packets of ``frames`` 20 ms frames each, ``per_page``
    to a page, declaring ``hours`` of audio: 120 ms packets (the longest) take about 90 KB
    an hour."""
    samples = frames * oggfiles.FRAME_20_MS
    packets = int(hours * 3600 * oggopus.RATE / samples)
    return oggfiles.opus_file([oggfiles.empty_packet(frames)] * packets, samples, per_page)


def silent_wav(seconds: float) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(_WAV_RATE)
        file.writeframes(bytes(2 * int(seconds * _WAV_RATE)))
    return out.getvalue()


def post_head(length: int, content_type: str) -> bytes:
    return (f"POST {protocol.STREAMING_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {length}\r\n"
            "Connection: close\r\n\r\n").encode()


@dataclasses.dataclass(frozen=True)
class Bodies:
    """What the attacks send, made before they start: building a bomb holds the soak's
    GIL for a while, which would show as its own neighbour's latency."""

    bomb: bytes  # the upload
    stream_bomb: bytes  # the OggOpus message's data
    wav: bytes  # an abandoned upload

    @classmethod
    def build(cls, opts: argparse.Namespace) -> Bodies:
        # A stream's decoder (sphn's) refuses a page of more than about 5 s of audio.
        return cls(opus_bomb(opts.bomb_hours), opus_bomb(opts.bomb_hours, per_page=40),
                   silent_wav(opts.abandoned_seconds))


# Uploads (threads)


def upload_bombs(target: tuple[str, int], opts: argparse.Namespace,
                 bodies: Bodies) -> dict[str, Any]:
    body = bodies.bomb
    request = post_head(len(body), "audio/ogg") + body
    answers = attacks.in_threads(opts.upload_bombs,
                          lambda: _timed(lambda: attacks.exchange(target, request, 120)))
    return {"tried": opts.upload_bombs, "bytes_each": len(body),
            "declared_s": round(oggopus.stream_samples(body) / oggopus.RATE),
            "statuses": attacks.counted([attacks.status_of(a) for a, _ in answers]),
            "answers": sorted({_body_of(a) for a, _ in answers}),
            "answered_after_s": _seconds([s for _, s in answers])}


def abandoned_uploads(target: tuple[str, int], opts: argparse.Namespace, bodies: Bodies,
                      used_slots: Callable[[], int]) -> dict[str, Any]:
    """One after another: post, wait until the pod holds a slot for it, go away; how long
    until the slot is free again (None: still held after 10 s)."""
    body = bodies.wav
    request = post_head(len(body), "audio/wav") + body
    idle = used_slots()
    freed, taken = [], 0
    for _ in range(opts.abandoned_uploads):
        sock = attacks.connect(target, timeout=30)
        try:
            sock.sendall(request)
            taken += _until(lambda: used_slots() > idle, 30.0) is not None
        finally:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        freed.append(_until(lambda: used_slots() <= idle, 10.0))
    return {"tried": opts.abandoned_uploads, "audio_s_each": opts.abandoned_seconds,
            "slots_taken": taken, "freed_after_s": freed,
            "slots_held": sum(seconds is None for seconds in freed)}


def slow_bodies(target: tuple[str, int], opts: argparse.Namespace) -> dict[str, Any]:
    """Bodies declaring 1 MB: half send 4 bytes and stop, half send 100 bytes a second."""
    head = post_head(1 << 20, "audio/wav")
    stalled = opts.slow_bodies // 2
    slow = [b"x" * 100] * 600
    answers = attacks.in_threads(stalled, lambda: _timed(
        lambda: _trickle(target, head, [b"RIFF"], 0.0))) + attacks.in_threads(
        opts.slow_bodies - stalled, lambda: _timed(lambda: _trickle(target, head, slow, 1.0)))
    return {"tried": opts.slow_bodies, "statuses": attacks.counted([attacks.status_of(a)
                                                             for a, _ in answers]),
            "answers": sorted({_body_of(a) for a, _ in answers}),
            "answered_after_s": _seconds([s for _, s in answers]),
            "connections_held": sum(not a for a, _ in answers)}


def _trickle(target: tuple[str, int], head: bytes, pieces: list[bytes],
             pause: float) -> bytes:
    """Send the head, then ``pieces`` ``pause`` s apart until the target answers, then
    nothing more; the answer (empty: none within 120 s)."""
    sock = attacks.connect(target, timeout=10)
    try:
        sock.sendall(head)
        for piece in pieces:
            sock.sendall(piece)
            if pause and (answer := attacks.read_all(sock, pause)):
                return answer
        return attacks.read_all(sock, 120)
    except OSError:  # refused while sending, and the answer lost with it
        return b""
    finally:
        sock.close()


# The websocket bomb (asyncio)


async def opus_stream_bomb(url: str, opts: argparse.Namespace, bodies: Bodies
                           ) -> dict[str, Any]:
    """One message declaring hours, the stream then held open and read."""
    data = bodies.stream_bomb
    message = msgpack.packb({"type": "OggOpus", "data": data}, use_bin_type=True)
    steps, errors = 0, []
    async with ws_client.connect(url, max_size=None, compression=None) as ws:
        await ws.recv()  # Ready
        await ws.send(message)
        with contextlib.suppress(TimeoutError, websockets.ConnectionClosed):
            async with asyncio.timeout(opts.opus_bomb_seconds):
                async for frame in ws:
                    got = msgpack.unpackb(frame)
                    steps += got.get("type") == "Step"
                    if got.get("type") == "Error":
                        errors.append(got.get("code"))
    audio_s = steps * protocol.FRAME_SIZE / protocol.SAMPLE_RATE
    return {"tried": 1, "bytes": len(message),
            "declared_s": round(oggopus.stream_samples(data) / oggopus.RATE),
            "held_s": opts.opus_bomb_seconds, "steps": steps,
            "audio_stepped_s": round(audio_s, 1), "error_codes": errors}


# Helpers


def _timed(call: Callable[[], bytes]) -> tuple[bytes, float]:
    started = time.monotonic()
    answer = call()
    return answer, time.monotonic() - started


def _until(condition: Callable[[], bool], timeout: float) -> float | None:
    """Seconds until ``condition`` held (polled every 20 ms), None if it did not in time."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            return None
        time.sleep(0.02)
    return round(time.monotonic() - started, 2)


def _body_of(answer: bytes) -> str:
    """An HTTP answer's status line and body, for the report."""
    head, _, body = answer.partition(b"\r\n\r\n")
    return (head.split(b"\r\n", 1)[0] + b": " + body[:200]).decode(errors="replace")


def _seconds(values: list[float]) -> list[float]:
    return sorted(round(value, 1) for value in values)
