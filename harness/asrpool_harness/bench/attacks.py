"""Hostile clients on raw sockets, for the hostile-client tests and ``asrpool bench soak``.

Each speaks just enough HTTP/1.1 and RFC 6455 to be what it pretends to be (a client
that never reads, a request head that never ends, a flood of tiny frames) and
reports what the server answered. Blocking sockets: each attack is one thread.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgpack
import numpy as np

from asrpool.bench import wsload
from asrpool.common import protocol

TINY_RCVBUF = 1024  # the kernel's minimum: the server's sends stall after ~100 KB


def upgrade_request(path: str = protocol.STREAMING_PATH,
                    headers: Mapping[str, str] | None = None, host: str = "127.0.0.1") -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Upgrade: websocket",
             "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def client_frame(message: Mapping[str, object]) -> bytes:
    """One masked binary frame of a MessagePack message, as a client sends it."""
    return masked(msgpack.packb(dict(message), use_single_float=True))


def masked(payload: bytes) -> bytes:
    return wsload.frame(payload, mask=os.urandom(4))


def audio_frame(samples: int = protocol.FRAME_SIZE, seed: int = 0) -> bytes:
    pcm = (np.random.default_rng(seed).standard_normal(samples) * 0.1).astype(np.float32)
    return client_frame({"type": "Audio", "pcm": pcm.tolist()})


def connect(address: tuple[str, int], rcvbuf: int | None = None,
            timeout: float = 10.0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connect: it sets the window the server sees
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect(address)
    return sock


@dataclasses.dataclass
class Streamed:
    frames_sent: int
    cut: bool  # the server reset or closed the connection
    seconds: float


def stream_without_reading(address: tuple[str, int], headers: Mapping[str, str],
                           seconds: float, paced: bool = False) -> Streamed:
    """Handshake (reading the 101, as a client must before it sends), then send audio
    (as fast as the server takes it, or in real time) for ``seconds`` and never read
    another byte: no result, no ping."""
    sock = connect(address, rcvbuf=TINY_RCVBUF, timeout=10.0)
    frame, sent = audio_frame(), 0
    started = time.monotonic()
    try:
        sock.sendall(upgrade_request(headers=headers))
        read_head(sock)
        sock.settimeout(0.5)
        while time.monotonic() - started < seconds:
            with contextlib.suppress(TimeoutError):
                sock.sendall(frame)
                sent += 1
            if paced:
                time.sleep(protocol.FRAME_SIZE / protocol.SAMPLE_RATE)
    except OSError:  # reset or broken pipe: the server dropped it
        return Streamed(sent, True, time.monotonic() - started)
    finally:
        sock.close()
    return Streamed(sent, False, time.monotonic() - started)


def read_head(sock: socket.socket) -> bytes:
    """The HTTP response head, byte by byte (nothing after it is read)."""
    head = bytearray()
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        if not byte:
            raise ConnectionError(f"closed during the handshake: {bytes(head)!r}")
        head += byte
    return bytes(head)


def exchange(address: tuple[str, int], data: bytes, timeout: float = 10.0,
             chunk: int = 1 << 16) -> bytes:
    """Send ``data`` (stopping where the server stops taking it), then read until the
    server closes or ``timeout``: what it answered."""
    sock = connect(address, timeout=timeout)
    try:
        with contextlib.suppress(OSError):
            for start in range(0, len(data), chunk):
                sock.sendall(data[start:start + chunk])
        return read_all(sock, timeout)
    finally:
        sock.close()


def read_all(sock: socket.socket, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    received = bytearray()
    with contextlib.suppress(OSError):
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = sock.recv(1 << 16)
            if not data:
                break
            received += data
    return bytes(received)


def status_of(answer: bytes) -> int | None:
    """The status code of an HTTP response, None if there was none."""
    parts = answer.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.1"):
        return None
    return int(parts[1])


def in_threads(count: int, attack: Callable[[], Any]) -> list[Any]:
    """``attack`` run ``count`` times at once, one thread each; what each returned."""
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(attack())) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def counted(values: list[Any]) -> dict[str, int]:
    """How often each value came, keyed by its text (for a JSON report)."""
    return {str(k): v for k, v in collections.Counter(values).items()}
