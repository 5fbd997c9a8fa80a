"""The router against nginx in front of the same websocket backend, in one run.

    asrpool bench router --baseline nginx --streams 100,500 --seconds 20

One backend (``bench.wsload``: ``Ready``, then a 40-byte answer to each 9.6 KB
message), four ways to reach it: directly, through nginx (one worker, the usual
websocket ``proxy_pass``), through the router (admitted in a fresh Redis where the
backend is a pod's heartbeat) and through the floor relay (``bench.floor_relay``: reads
written to the other side as they are, on uvloop: the least a Python relay costs).
For each stream count the four phases alternate; each stream sends a message every
80 ms and times each reply. Written: the added p50/p99 latency of each proxy over
direct, each proxy's CPU (its processes in /proc) per client message relayed (with its
reply) over the whole phase and over its steady part (all streams open: what long
streams cost; the rest is each stream's opening and closing, given per stream), and the
router's ratios to nginx and to the floor relay, to
``bench/results/router-vs-nginx.json`` (and a PNG when matplotlib is importable).
Then ``--churn-streams`` short streams per proxy (upgrade, ``Ready``, one message, close;
ten at a time) give what opening and closing a stream costs each proxy, side by side.
nginx is installed with apt-get when missing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from asrpool.bench import router as router_bench
from asrpool.bench import stats, wsload
from asrpool.common import processes, protocol, registry

NGINX_CONF = """worker_processes 1;
worker_rlimit_nofile 16384;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi; uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://127.0.0.1:{backend};
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_buffering off;
      proxy_read_timeout 3600s;
      proxy_send_timeout 3600s;
    }}
  }}
}}
"""


PROXIES = ("nginx", "router", "floor")
MODES = ("direct", *PROXIES)
STOP_TIMEOUT = 10.0  # each of the stack's processes, from SIGTERM to SIGKILL


class BenchError(RuntimeError):
    pass


def nginx_binary() -> str:
    """nginx's path, installing ``nginx-light`` with apt-get when it is missing."""
    found = shutil.which("nginx") or (os.path.exists("/usr/sbin/nginx") and "/usr/sbin/nginx")
    if found:
        return found
    try:
        subprocess.run(["apt-get", "install", "-y", "-q", "nginx-light"], check=True,
                       capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BenchError(f"nginx is missing and apt-get install nginx-light failed: {exc}") from exc
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(found):
        raise BenchError("nginx is missing and apt-get installed no nginx binary")
    return found


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and every live descendant."""
    total = 0.0
    for member in {pid} | processes.descendants(pid):
        with contextlib.suppress(OSError):  # it exited meanwhile
            total += processes.cpu_seconds(member)
    return total


class Stack:
    """Redis, the backend, nginx and the router, started once for the whole run."""

    def __init__(self, workdir: Path, router_args: list[str]) -> None:
        self.workdir, self.router_args = workdir, router_args
        self.children: list[processes.Child] = []
        self.ports = {name: processes.free_port()
                      for name in ("backend", "nginx", "router", "floor")}

    def __enter__(self) -> Stack:
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        nginx = nginx_binary()
        redis, self.redis_url = router_bench.start_redis(self.workdir)
        self.children.append(redis)
        self._run("backend", [sys.executable, "-m", "asrpool.bench.wsload", "backend",
                              "--port", str(self.ports["backend"])])
        asyncio.run(self._heartbeat())
        conf = self.workdir / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=self.workdir, port=self.ports["nginx"],
                                          backend=self.ports["backend"]))
        self._run("nginx", [nginx, "-p", str(self.workdir), "-c", str(conf)])
        self._run("router", [sys.executable, "-m", "asrpool.cli", "route", "--redis-url",
                             self.redis_url, "--host", "127.0.0.1", "--port",
                             str(self.ports["router"]), "--log-level", "warning",
                             "--workers", "1", "--new-streams-per-second", "0",
                             "--no-members-required",  # its backend only heartbeats
                             *self.router_args])
        self._run("floor", [sys.executable, "-m", "asrpool_harness.bench.floor_relay",
                            str(self.ports["floor"]), str(self.ports["backend"])])

    def _run(self, name: str, argv: list[str]) -> None:
        child = processes.spawn(name, argv, self.workdir / f"{name}.log")
        self.children.append(child)
        setattr(self, f"{name}_pid", child.process.pid)
        port = self.ports[name]
        processes.wait_until(lambda: processes.port_answers(port), 30,
                             f"{name} on port {port}", [child], period=0.1)

    async def _heartbeat(self) -> None:
        client = router_bench.redis_client(self.redis_url)
        beat = registry.PodHeartbeat("backend", registry.DEFAULT_POOL,
                                     f"127.0.0.1:{self.ports['backend']}", 5000, 5000, False,
                                     "bench")
        await registry.write_heartbeat(client, beat, lease_ms=3_600_000)
        await client.aclose()

    def __exit__(self, *_: object) -> None:
        for child in reversed(self.children):
            child.stop(STOP_TIMEOUT)


def phase(stack: Stack, mode: str, count: int, seconds: float) -> dict[str, Any]:
    """One phase: ``count`` real-time streams for ``seconds``. CPU per message is given
    over the whole phase (opening and closing the streams included) and over its
    steady part alone (all streams open: what a long stream costs per message); what
    is left of the whole is each stream's opening and closing."""
    import uvloop

    pid = getattr(stack, f"{mode}_pid", None) if mode != "direct" else None
    rtts: list[float] = []
    steady = _SteadyWindow(pid, rtts, seconds) if pid else None
    cpu0, t0 = (tree_cpu(pid) if pid else 0.0), time.monotonic()
    run: dict[str, Any] = uvloop.run(wsload.run_streams("127.0.0.1", stack.ports[
        "backend" if mode == "direct" else mode], protocol.STREAMING_PATH, count, seconds, rtts))
    cpu = (tree_cpu(pid) - cpu0) if pid else math.nan
    elapsed = time.monotonic() - t0
    messages = int(run["messages_sent"])
    time.sleep(1.0)  # sessions settle
    per_message = steady.cpu_per_message() if steady else math.nan
    return {**run, "rtt": stats.percentiles(rtts), "cpu_s": cpu,
            "cpu_cores": cpu / elapsed,
            "cpu_per_message_ms": cpu / messages * 1e3 if messages else math.nan,
            "steady_cpu_per_message_ms": per_message * 1e3,
            "open_close_cpu_per_stream_ms": (cpu - per_message * messages) / count * 1e3}


class _SteadyWindow:
    """The proxy's CPU and the replies counted from ``STEADY_FROM_S`` into a phase (all
    its streams open) until half a second before its streams stop sending."""

    STEADY_FROM_S = 2.0

    def __init__(self, pid: int, rtts: list[float], seconds: float) -> None:
        self.pid, self.rtts = pid, rtts
        self.marks: list[tuple[float, int]] = []
        self.timers = [threading.Timer(at, self._mark)
                       for at in (self.STEADY_FROM_S, max(self.STEADY_FROM_S + 1, seconds - 0.5))]
        for timer in self.timers:
            timer.start()

    def _mark(self) -> None:
        self.marks.append((tree_cpu(self.pid), len(self.rtts)))

    def cpu_per_message(self) -> float:
        for timer in self.timers:
            timer.join()
        if len(self.marks) < 2 or self.marks[1][1] <= self.marks[0][1]:
            return math.nan
        (cpu0, replies0), (cpu1, replies1) = self.marks
        return (cpu1 - cpu0) / (replies1 - replies0)


def compare(stack: Stack, count: int, seconds: float, rounds: int) -> dict[str, Any]:
    phases: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    orders = (MODES, tuple(reversed(MODES)))
    for r in range(rounds):
        for mode in orders[r % 2]:
            phases[mode].append(phase(stack, mode, count, seconds))
            print(f"{count} streams, {mode}: {json.dumps(phases[mode][-1]['rtt'])}, "
                  f"cpu/msg {phases[mode][-1]['cpu_per_message_ms']:.4f} ms, steady "
                  f"{phases[mode][-1].get('steady_cpu_per_message_ms', math.nan):.4f} ms",
                  flush=True)

    def mean(mode: str, field: str) -> float:
        values: list[float] = [
            p["rtt"].get(field, math.nan) if field in ("p50_ms", "p99_ms") else p[field]
            for p in phases[mode]]
        return sum(values) / len(values)

    out: dict[str, Any] = {"streams": count, "seconds": seconds, "phases": phases}
    for proxy in PROXIES:
        out[proxy] = {
            "added_p50_ms": mean(proxy, "p50_ms") - mean("direct", "p50_ms"),
            "added_p99_ms": mean(proxy, "p99_ms") - mean("direct", "p99_ms"),
            "cpu_per_message_ms": mean(proxy, "cpu_per_message_ms"),
            "steady_cpu_per_message_ms": mean(proxy, "steady_cpu_per_message_ms"),
            "open_close_cpu_per_stream_ms": mean(proxy, "open_close_cpu_per_stream_ms"),
            "cpu_cores": mean(proxy, "cpu_cores"),
        }
    for anchor in ("nginx", "floor"):
        out[f"router_over_{anchor}"] = {
            field: _ratio(out["router"][field], out[anchor][field])
            for field in ("added_p50_ms", "added_p99_ms", "cpu_per_message_ms",
                          "steady_cpu_per_message_ms", "open_close_cpu_per_stream_ms")
        }
    return out


def churn(stack: Stack, count: int, rounds: int, at_once: int = 10) -> dict[str, Any]:
    """What opening and closing a stream costs each proxy: ``count`` short streams
    (upgrade, ``Ready``, one message and its reply, close), ``at_once`` at a time, per
    proxy and round (the proxies alternate); each proxy's CPU per stream, its mean over
    the rounds, and the router's ratios."""
    import uvloop

    per_stream: dict[str, list[float]] = {proxy: [] for proxy in PROXIES}
    rates: dict[str, list[float]] = {proxy: [] for proxy in PROXIES}
    for r in range(rounds):
        for proxy in (PROXIES if r % 2 == 0 else tuple(reversed(PROXIES))):
            pid = getattr(stack, f"{proxy}_pid")
            cpu0, t0 = tree_cpu(pid), time.monotonic()
            uvloop.run(wsload.churn("127.0.0.1", stack.ports[proxy], protocol.STREAMING_PATH,
                                    count, at_once))
            elapsed = time.monotonic() - t0
            time.sleep(0.5)  # the last closes settle
            per_stream[proxy].append((tree_cpu(pid) - cpu0) / count * 1e3)
            rates[proxy].append(count / elapsed)
            print(f"churn, {proxy}: {per_stream[proxy][-1]:.3f} ms CPU per stream, "
                  f"{rates[proxy][-1]:.0f} streams/s", flush=True)
    out: dict[str, Any] = {"streams": count, "at_once": at_once, "rounds": rounds}
    for proxy in PROXIES:
        out[proxy] = {"cpu_per_stream_ms": sum(per_stream[proxy]) / rounds,
                      "cpu_per_stream_ms_each_round": per_stream[proxy],
                      "streams_per_s": sum(rates[proxy]) / rounds}
    for anchor in ("nginx", "floor"):
        out[f"router_over_{anchor}"] = _ratio(out["router"]["cpu_per_stream_ms"],
                                             out[anchor]["cpu_per_stream_ms"])
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def plot(result: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        return
    rows = result["runs"]
    fig, axes = pyplot.subplots(1, 4, figsize=(16, 3.5))
    fields = ("added_p50_ms", "added_p99_ms", "cpu_per_message_ms", "steady_cpu_per_message_ms")
    for ax, field in zip(axes, fields, strict=True):
        for offset, proxy in zip((-0.27, 0.0, 0.27), PROXIES, strict=True):
            ax.bar([i + offset for i in range(len(rows))], [r[proxy][field] for r in rows],
                   0.27, label=proxy)
        ax.set_xticks(range(len(rows)), [f"{r['streams']} streams" for r in rows])
        ax.set_title(field)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(opts: argparse.Namespace) -> int:
    counts = [int(c) for c in opts.streams.split(",")]
    path = Path(opts.out) / "router-vs-nginx.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "command": "asrpool bench router --baseline nginx " + " ".join(sys.argv[3:]),
        "cpu_per_message": "proxy CPU seconds over a phase / client messages sent "
        "(each with its reply)",
        "runs": [],
    }
    try:
        with tempfile.TemporaryDirectory() as workdir:
            stack = Stack(Path(workdir), opts.router_arg)
            with stack:
                for count in counts:
                    result["runs"].append(compare(stack, count, opts.seconds, opts.rounds))
                    path.write_text(json.dumps(result, indent=2))
                if opts.churn_streams:
                    result["churn"] = churn(stack, opts.churn_streams, max(2, opts.rounds * 2))
                    path.write_text(json.dumps(result, indent=2))
    except (BenchError, processes.StartError) as exc:
        print(f"asrpool bench router: {exc}", file=sys.stderr)
        return 1
    summary = [{key: r[key] for key in ("streams", *PROXIES, "router_over_nginx",
                                        "router_over_floor")} for r in result["runs"]]
    print(json.dumps(summary, indent=2))
    if "churn" in result:
        print(json.dumps(result["churn"], indent=2))
    plot(result, path.with_suffix(".png"))
    print(f"wrote {path}")
    return 0
