"""OpenAI's official Node SDK (``openai`` on npm, pinned in tests/node/package.json),
unchanged, through a real router to a real pod: one transcription session, its events
as the SDK's own emitter hands them out.

The Node SDK always dials ``wss`` (its URL builder sets the scheme), so TLS sits in
front of the router here, as an Ingress would: a TLS proxy of the test's own on a
certificate made for 127.0.0.1, whose CA the script is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.router import support
from tests.server.test_realtime_sdk import pcm16
from tests.support import servers
from tests.support.redis_servers import RedisServer

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
COMPLETED = "conversation.item.input_audio_transcription.completed"


@pytest.fixture(scope="module")
def router(module_redis: RedisServer,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[support.RouterProcess]:
    workdir = tmp_path_factory.mktemp("node")
    pod: servers.ServerProcess = support.pod(module_redis.url, workdir, "node-pod", 1)
    proc = support.router(module_redis.url, workdir)
    try:
        pod.start()
        pod.wait_ready()
        proc.start()
        support.wait_until(lambda: support.pods_in_view(proc) == 1, 20, "the pod in view")
        yield proc
    finally:
        proc.kill()
        pod.stop()


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (openssl)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@contextlib.asynccontextmanager
async def tls_in_front_of(port: int, cert: Path, key: Path) -> AsyncIterator[int]:
    """TLS on a port of its own, each connection's bytes passed on to ``port`` as they are."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer),
                             return_exceptions=True)

    server = await asyncio.start_server(relay, "127.0.0.1", 0, ssl=context)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def test_the_node_sdk_transcribes_a_turn_through_the_router(
        router: support.RouterProcess, tmp_path: Path) -> None:
    assert (NODE_DIR / "node_modules" / "openai").is_dir(), \
        "tests/node has no node_modules: make test installs them (npm ci)"
    cert, key = certificate(tmp_path)
    audio = tmp_path / "turn.pcm"
    audio.write_bytes(pcm16(2.0, seed=11).tobytes())
    port = int(router.url.rsplit(":", 1)[1])
    async with tls_in_front_of(port, cert, key) as tls_port:
        env = {**os.environ, "BASE_URL": f"https://127.0.0.1:{tls_port}/v1",
               "API_KEY": "sk-unused", "AUDIO_FILE": str(audio), "CA_FILE": str(cert)}
        node = shutil.which("node") or "node"
        done = await asyncio.to_thread(
            subprocess.run, [node, str(NODE_DIR / "realtime.mjs")], env=env, cwd=NODE_DIR,
            capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = [e["type"] for e in events if not e["type"].endswith(".delta")]
    assert kinds == ["session.created", "session.updated", "input_audio_buffer.committed",
                     "conversation.item.added", "conversation.item.done", COMPLETED]
    completed = events[-1]
    deltas = [e["delta"] for e in events if e["type"].endswith(".delta")]
    assert completed["transcript"] == "".join(deltas)
    assert completed["usage"] == {"type": "duration", "seconds": 2.0}
    assert len({e["event_id"] for e in events}) == len(events)
