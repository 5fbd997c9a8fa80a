"""Running the router app under uvicorn, in one process or in ``workers`` processes.

Workers share nothing but Redis: each is a whole router (its own Redis client, lease
renewal, metrics) with its own listening socket on the same port (``SO_REUSEPORT``:
the kernel spreads new connections over them). The parent only supervises: it
forwards SIGTERM and SIGINT (each worker then drains as a single router does,
``router.draining``),
restarts a worker that dies, and its workers die with it (``PR_SET_PDEATHSIG``), so a
killed router is a killed router whatever its worker count.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import time

import uvicorn

from asrpool.common import auth, limits, logs
from asrpool.router import app, draining, metrics, settings, wiring

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
# A worker that exits sooner than this after its start failed to start: stop, not retry.
STARTUP_S = 5.0


def uvicorn_config(config: settings.RouterSettings,
                   deps: wiring.Deps | None = None) -> uvicorn.Config:
    # Until a stream is admitted the sans-I/O websockets protocol applies moshi-server's
    # frame limit and liveness (framing.WebSocketProtocol); then the raw connection is
    # handed over to the relay (router/relaying.py). No permessage-deflate on either leg
    # (limits.uvicorn_options), so frames pass through unchanged. uvloop runs the relay's protocols.
    # Dependencies are built here, not in the lifespan, so that a bad key file fails the
    # command (exit 2) before uvicorn starts; they connect lazily inside its loop.
    # Before authentication, limits.uvicorn_options bounds what a connection may cost,
    # and refuses a client address over its new streams per second (router.throttling).
    deps = deps or wiring.build(config)
    uv_config = uvicorn.Config(
        app.StreamingFastPath(app.create_app(config, deps), config.admin_port),
        host=config.host,
        port=config.port,
        loop="uvloop",
        **limits.uvicorn_options(config.connection_limits, deps.new_streams),
        ws_max_size=config.max_message_bytes,
        # A client that answers no ping within the timeout and sent nothing else
        # meanwhile is gone; one held back by its pod (not read meanwhile) is not.
        ws_ping_interval=config.ping_interval_seconds,
        ws_ping_timeout=config.ping_timeout_seconds,
        lifespan="on",
        log_level=config.log_level,
        timeout_graceful_shutdown=5,
        backlog=4096,
    )
    auth.redact_server_logs()  # after the Config: it configures uvicorn's loggers
    return uv_config


def serve(config: settings.RouterSettings) -> int:
    logs.configure(config.log_level)
    if config.workers == 1:
        return _run(config, None)
    shared = _bind(config, reuse_port=False) if config.port == 0 else None
    return Supervisor(config, shared).run()


def _run(config: settings.RouterSettings, sock: socket.socket | None) -> int:
    deps = wiring.build(config)
    server = draining.DrainingRouter(uvicorn_config(config, deps), deps)
    sockets = [sock] if sock is not None else []
    if config.admin_port is not None:  # both ports, then: uvicorn binds none itself
        sockets = (sockets or [_bind(config, config.workers > 1)]) + [
            _bind(config, config.workers > 1, config.admin_port)]
    server.run(sockets=sockets or None)
    return 0 if server.started else 1


def _bind(config: settings.RouterSettings, reuse_port: bool,
          port: int | None = None) -> socket.socket:
    """A listening socket on ``port`` (default: the public one)."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((config.host, config.port if port is None else port))
    sock.set_inheritable(True)
    return sock


class Supervisor:
    """The parent of ``config.workers`` router processes."""

    def __init__(self, config: settings.RouterSettings, shared: socket.socket | None) -> None:
        self.config, self.shared = config, shared
        self.children: dict[int, tuple[int, float]] = {}  # pid: (worker index, started)
        self.stopping = False

    def run(self) -> int:
        for index in range(self.config.workers):
            self._fork(index)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        worst = 0
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            index, started = self.children.pop(pid)
            metrics.forget_worker(pid)
            code = os.waitstatus_to_exitcode(status)
            worst = max(worst, abs(code))
            if self.stopping:
                continue
            if time.monotonic() - started < STARTUP_S:
                log.error("router worker %d exited at start (%d): stopping", index, code)
                self._stop(signal.SIGTERM, None)
                continue
            log.warning("router worker %d exited (%d): restarting it", index, code)
            self._fork(index)
        return 1 if worst and not self.stopping else 0

    def _fork(self, index: int) -> None:
        # ``workers`` stays: a worker enforces its share of the router's new-streams limit
        worker = self.config.model_copy(update={"router_id": f"{self.config.router_id}-w{index}"})
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                _die_with_parent()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                sock = self.shared or _bind(worker, reuse_port=True)
                code = _run(worker, sock)
            finally:
                os._exit(code)
        self.children[pid] = (index, time.monotonic())

    def _stop(self, signum: int, _: object) -> None:
        self.stopping = True
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
