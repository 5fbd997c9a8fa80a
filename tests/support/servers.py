"""Real ``asrpool serve`` processes on free loopback ports, for any suite.

    with servers.ServerProcess(tmp_path, batch_size=2) as server:
        server.wait_ready()
        ... server.ws_url, server.http_get("/metrics"), server.rss_bytes() ...

The process runs ``python -m asrpool.cli serve`` with the ``tiny`` model unless told
otherwise; its output goes to ``server.log_path`` (shown when a start fails). It uses
one torch thread: on a small shared CPU, torch's default (all cores) is several times
slower per step when other processes compete (same results, measured).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asrpool.common import processes
from asrpool.common.processes import free_port


class ServerProcess:
    def __init__(self, workdir: Path, *, model: str = "tiny", batch_size: int = 2,
                 args: Sequence[str] = (), env: dict[str, str] | None = None,
                 port: int | None = None, pod_id: str | None = None,
                 torch_threads: int = 1) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.pod_id = pod_id or f"pod-{self.port}"
        self.log_path = workdir / f"server-{self.port}.log"
        self.command = [
            sys.executable, "-m", "asrpool.cli", "serve", "--model", model,
            "--batch-size", str(batch_size), "--host", "127.0.0.1", "--port", str(self.port),
            "--pod-id", self.pod_id, "--torch-threads", str(torch_threads), *args,
        ]
        self.env = {**os.environ, **(env or {})}
        self.child: processes.Child | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.address}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.address}/api/asr-streaming"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> ServerProcess:
        self.child = processes.spawn(f"asrpool serve on port {self.port}", self.command,
                                     self.log_path, env=self.env, cwd=self.workdir)
        self.process = self.child.process
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Poll ``/readyz`` until 200; fail with the server's log if it dies or times out."""
        children = [] if self.child is None else [self.child]
        try:
            processes.wait_until(lambda: self.http_status("/readyz") == 200, timeout,
                                 f"asrpool serve on port {self.port}", children, period=0.1)
        except processes.StartError as exc:
            raise RuntimeError(f"{exc}:\n{self.log()}") from None

    def http_status(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(self.http_url + path, timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def http_get(self, path: str) -> str:
        with urllib.request.urlopen(self.http_url + path, timeout=5) as response:
            return str(response.read().decode())

    def modules_info(self) -> dict[str, Any]:
        """The batched ASR module of ``/api/modules_info`` (moshi-server's list of string
        maps), its slot counts as ints."""
        module = json.loads(self.http_get("/api/modules_info"))[0]
        ints = {k: int(module[k]) for k in ("used_slots", "total_slots")}
        return dict(module) | ints

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no slot is used (a closed stream frees its slot a moment later)."""
        deadline = time.monotonic() + timeout
        while self.modules_info()["used_slots"]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"slots still used after {timeout} s: {self.modules_info()}")
            time.sleep(0.02)

    def metric(self, name: str) -> float | None:
        """The value of an unlabelled sample in ``/metrics``, or None."""
        for line in self.http_get("/metrics").splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def rss_bytes(self) -> int:
        return live_rss_bytes(self.pid)

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self) -> None:
        """SIGTERM (drain); a second SIGTERM cuts the drain short; SIGKILL as a last resort."""
        if self.process is None or self.process.poll() is not None:
            return
        for signum, patience in ((signal.SIGTERM, 3), (signal.SIGTERM, 10)):
            self.process.send_signal(signum)
            try:
                self.process.wait(patience)
                return
            except subprocess.TimeoutExpired:
                pass
        self.process.kill()
        self.process.wait()

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# An upload names an audio content type (anything else is 415: asrpool.common.browsers).
UPLOAD_HEADERS = {"Content-Type": "application/octet-stream"}


def post_file(url: str, body: bytes, timeout: float = 300.0) -> tuple[int, str]:
    """``POST url/api/asr-streaming`` with ``body``: the status and the answer's text
    (an error status too)."""
    request = urllib.request.Request(url + "/api/asr-streaming", data=body, method="POST",
                                     headers=UPLOAD_HEADERS)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def live_rss_bytes(pid: int) -> int:
    """Resident memory of a live process (a test's reading of 0 from a zombie would
    pass any bound on growth)."""
    rss = processes.rss_bytes(pid)
    assert rss > 0, f"process {pid} has exited: no resident memory to read"
    return rss
