"""The whole platform on one machine: `asrpool demo`, `asrpool up` and `asrpool stream`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
import pytest
from websockets.asyncio.client import connect

from asrpool.common import auth, processes
from asrpool.common.processes import free_port
from tests.support import servers

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "hello.wav"


def _asrpool(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "asrpool.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def _transcribe_words(batch_size: int) -> list[str]:
    result = _asrpool("transcribe", str(SAMPLE), "--json", "--batch-size", str(batch_size),
                      "--torch-threads", "1")  # as the local pods run
    assert result.returncode == 0, result.stderr
    return [m["text"] for m in map(json.loads, result.stdout.splitlines()) if m["type"] == "Word"]


def test_demo_prints_the_transcript_of_the_pods_batch_size() -> None:
    result = _asrpool("demo", "--port", str(free_port()), "--slots-per-pod", "2")
    assert result.returncode == 0, result.stderr
    transcript = result.stdout.strip().splitlines()[-1]
    assert transcript.split() == " ".join(_transcribe_words(batch_size=2)).split()
    assert "2 pods, 4 slots" in result.stdout


class UpProcess:
    def __init__(self, policy: str, workdir: Path) -> None:
        self.port = free_port()
        self.child = processes.spawn(
            "asrpool up",
            [sys.executable, "-m", "asrpool.cli", "up", "--pods", "2", "--slots-per-pod", "2",
             "--port", str(self.port), "--policy", policy], workdir / "up.log")
        self.process = self.child.process

    def wait_ready(self, timeout: float = 180) -> None:
        def ready() -> bool:
            pools = self.pools()
            return bool(pools and len(pools.get("default", {}).get("pods", [])) == 2)

        try:
            processes.wait_until(ready, timeout, "asrpool up", [self.child], period=0.3)
        except processes.StartError as exc:
            if self.process.poll() is not None:
                raise AssertionError(self.child.log.read_text(errors="replace")) from None
            raise AssertionError("asrpool up did not start in time") from exc

    def pools(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/pools") as response:
                return dict(json.load(response)["pools"])
        except OSError:
            return None

    def stream(self, rtf: str = "1.0") -> subprocess.CompletedProcess[str]:
        return _asrpool("stream", f"ws://127.0.0.1:{self.port}", str(SAMPLE), "--rtf", rtf,
                        "--json", timeout=120)


def _sessions_per_pod(up: UpProcess) -> list[int]:
    pools = up.pools() or {}
    return sorted(pod["router_sessions"] for pod in pools["default"]["pods"])


@pytest.mark.parametrize(("policy", "expected"), [("spread", [1, 1]), ("pack", [0, 2])])
def test_up_places_streams_per_policy_and_ctrl_c_leaves_nothing(
    policy: str, expected: list[int], tmp_path: Path
) -> None:
    up = UpProcess(policy, tmp_path)
    try:
        up.wait_ready()
        tree = processes.descendants(up.process.pid)
        assert len(tree) >= 4  # redis, two pods, a router (and their helpers)
        with concurrent.futures.ThreadPoolExecutor(2) as clients:  # two streams at once
            streams = [clients.submit(up.stream), clients.submit(up.stream)]
            with contextlib.suppress(processes.StartError):
                processes.wait_until(lambda: sum(_sessions_per_pod(up)) >= 2, 30,
                                            "both streams", period=0.1)
            assert _sessions_per_pod(up) == expected
            for stream in streams:
                result = stream.result()
                assert result.returncode == 0, result.stderr
                assert any(json.loads(line)["type"] == "Word"
                           for line in result.stdout.splitlines())
        up.process.send_signal(signal.SIGINT)
        assert up.process.wait(timeout=60) == 0
        with contextlib.suppress(processes.StartError):
            processes.wait_until(
                lambda: not any(processes.alive(pid) for pid in tree), 10, "the pods' end",
                period=0.1)
        assert not [pid for pid in tree if processes.alive(pid)]
    finally:
        _stop_tree(up.child)


def _stop_tree(up: processes.Child) -> None:
    """Stop `asrpool up` as a user would; kill whatever it leaves (a failed test too)."""
    tree = processes.descendants(up.process.pid)
    if up.alive():
        up.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            up.process.wait(timeout=60)
        if up.alive():
            up.stop(0)
    for pid in tree:
        if processes.alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_stream_reports_a_missing_file_in_one_line() -> None:
    result = _asrpool("stream", "ws://127.0.0.1:9", "/nonexistent.wav")
    assert result.returncode == 1
    assert result.stderr.strip() == "asrpool stream: no such audio file: /nonexistent.wav"


def test_stream_reports_an_unsupported_format_in_one_line() -> None:
    result = _asrpool("stream", "ws://127.0.0.1:9", str(ROOT / "pyproject.toml"))
    assert result.returncode == 1
    assert "cannot decode" in result.stderr and "Traceback" not in result.stderr


def test_stream_reports_a_router_that_is_down() -> None:
    port = free_port()
    result = _asrpool("stream", f"ws://127.0.0.1:{port}", str(SAMPLE))
    assert result.returncode == 1
    assert result.stderr.startswith(f"asrpool stream: cannot connect to ws://127.0.0.1:{port}")
    assert len(result.stderr.strip().splitlines()) == 1


def test_stream_reports_a_bad_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"keys:\n  - id: team\n    sha256: {auth.hash_key('right-key')}\n")
    with servers.ServerProcess(tmp_path, batch_size=1,
                               args=["--api-keys-file", str(keys)]) as server:
        server.wait_ready()
        result = _asrpool("stream", server.ws_url, str(SAMPLE), "--api-key", "wrong-key")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "asrpool stream: authentication failed (HTTP 401): check the API key")


async def test_stream_reports_a_busy_pool(tmp_path: Path) -> None:
    with servers.ServerProcess(tmp_path, batch_size=1) as server:
        server.wait_ready()
        async with connect(server.ws_url) as holder:
            assert msgpack.unpackb(await holder.recv())["type"] == "Ready"
            result = await asyncio.to_thread(_asrpool, "stream", server.ws_url, str(SAMPLE))
    assert result.returncode == 1
    assert result.stderr.strip() == "asrpool stream: server error (busy): no free channels"


def test_stream_sends_opus_and_a_pod_with_lanes_hears_what_one_without_does(
        tmp_path: Path) -> None:
    """`asrpool stream --opus` sends the file as Ogg Opus pages; a pod decoding them in
    its Opus lanes' children gives the same words, at the same times, as a pod decoding
    them on its event loop (the lanes decode to the same samples)."""
    transcripts = []
    for index, extra in enumerate(([], ["--opus-workers", "2"])):
        workdir = tmp_path / str(index)
        workdir.mkdir()
        with servers.ServerProcess(workdir, batch_size=1, args=extra) as server:
            server.wait_ready()
            result = _asrpool("stream", server.ws_url, str(SAMPLE), "--opus", "--json",
                              "--rtf", "8")
        assert result.returncode == 0, result.stderr
        messages = [json.loads(line) for line in result.stdout.splitlines()]
        assert not [m for m in messages if m["type"] == "Error"]
        transcripts.append([m for m in messages if m["type"] in ("Word", "EndWord")])
    assert transcripts[0], "no words from the Opus stream"
    assert transcripts[0] == transcripts[1]
