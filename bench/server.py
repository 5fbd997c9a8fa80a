"""Server benchmark: N concurrent real-time clients against a real ``asrpool serve``.

Starts one server process (``--model``, ``--batch-size``), then for each N in
``--clients`` runs N clients that send 80 ms frames at real time for ``--seconds``.
Per frame, latency is the time from sending it to receiving the ``Step`` message of
the step that consumed it: queueing plus the step itself, beyond the model's own
``asr_delay_in_tokens`` (which is the same for every deployment). Also recorded: the
server's step duration and step lag (from its ``/metrics``), its RSS over time (from
/proc), and the largest N whose p99 latency stayed under ``--max-p99``. Writes JSON to
``bench/results/``, and the server's output to a ``.log`` of the same name beside it.

    asrpool bench server --model small --batch-size 8 --clients 1,2,4,8 --seconds 20

At GPU scale without a GPU, ``--paced-engine FILE`` runs the pod on the paced stand-in of
a ``bench capacity`` result (``serve --paced-engine``: everything real but the model's
forward), driven by :mod:`rtclients`, whose pre-encoded streams keep real time by the
thousand on two cores:

    asrpool bench server --paced-engine bench/results/capacity-stt-1b-en_fr-cuda.json \
        --batch-size 1024 --clients 256,512,768,1024 --client-processes 1 --engine-process

``--protocols kyutai,realtime`` runs each round of N clients in both protocols, side by
side on the same pod: OpenAI's Realtime clients (:mod:`realtimeclients`) append one frame
per event and commit at the end; their rows give the pod's loop CPU per frame, the time
to ``session.created`` and the turn's ``completed`` after its commit, instead of the
per-frame latency (the protocol sends no ``Step``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import platform
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request
from concurrent import futures
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from websockets.asyncio import client as ws_client
from websockets.exceptions import InvalidStatus

from asrpool.bench import cli, realtimeclients, reports, rtclients
from asrpool.common import processes, protocol

SAMPLE_RATE = protocol.SAMPLE_RATE
FRAME = protocol.FRAME_SIZE
FRAME_SECONDS = FRAME / SAMPLE_RATE
FRAME_MS = round(FRAME_SECONDS * 1000)
MESSAGE_MS = (10, 20, 40, FRAME_MS)  # the pieces of a frame a client may send it in
PROTOCOLS = ("kyutai", "realtime")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asrpool bench server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--clients", default="1,2,4,8", help="comma-separated client counts")
    parser.add_argument("--seconds", type=float, default=20.0, help="audio per client")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="the server's --dtype (default: its own)")
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument("--client-processes", type=int, default=1,
                        help="spread the clients over this many processes (hundreds of "
                             "clients outrun one event loop, which would count as latency)")
    parser.add_argument("--engine-process", action="store_true",
                        help="the pod's engine in a child process (serve --engine-process)")
    parser.add_argument("--batches-in-flight", type=int, choices=(1, 2), default=None,
                        help="with --engine-process, the pod's --engine-batches-in-flight "
                             "(default: the pod's; file -inflight<n>)")
    parser.add_argument("--intake-workers", type=int, default=0,
                        help="the pod's --intake-workers: its streams' messages in N child "
                        "processes (0: on its event loop)")
    parser.add_argument("--gil-switch-ms", type=float, default=None,
                        help="the pod's GIL switch interval (serve --gil-switch-ms; default: "
                             "the pod's)")
    parser.add_argument("--message-ms", type=int, choices=MESSAGE_MS, default=FRAME_MS,
                        help="audio per client message: an 80 ms frame sent whole or in "
                             "pieces (browsers send 20-80 ms), paced in real time")
    parser.add_argument("--paced-engine", default=None, metavar="FILE",
                        help="the pod's engine is the paced stand-in of this bench capacity "
                             "result (serve --paced-engine): its model, no GPU; implies "
                             "--raw-clients")
    parser.add_argument("--raw-clients", action="store_true",
                        help="clients on raw asyncio protocols with pre-encoded frames "
                             "(bench.rtclients): a thousand keep real time on two cores; "
                             "they need a model with extra heads (a Step per frame)")
    parser.add_argument("--max-p99", type=float, default=0.5,
                        help="p99 latency (s) under which N counts as real time")
    parser.add_argument("--before", default=None, metavar="REF",
                        help="also run the pod of this git commit (a worktree of it), a "
                             "round of it before each round of this tree's: both in one "
                             "JSON (rounds_before), side by side (file -vs-REF)")
    parser.add_argument("--protocols", default="kyutai",
                        help="comma-separated: kyutai, realtime (each round in each)")
    parser.add_argument("--out", default="bench/results")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    protocols = args.protocols.split(",")
    if not set(protocols) <= set(PROTOCOLS) or (
            "realtime" in protocols and (args.raw_clients or args.paced_engine)):
        raise SystemExit("asrpool bench server: --protocols takes kyutai and realtime, "
                         "realtime with the websockets clients (not --raw-clients or "
                         "--paced-engine)")
    if args.paced_engine is not None:
        args.model, args.raw_clients = _paced_model(args.paced_engine), True
    counts = [int(n) for n in args.clients.split(",")]
    with contextlib.ExitStack() as stack:
        earlier = None
        if args.before is not None:
            hostwork = cli.harness_module("hostwork", "--before (an earlier commit's pod)")
            tree = stack.enter_context(hostwork.package_tree(args.before))
            earlier = _Server(args, _out_path(args, "-before.log"), python_path=tree)
            stack.callback(earlier.stop)
            earlier.wait_ready()
        server = _Server(args, _out_path(args, ".log"))
        stack.callback(server.stop)
        rss = _RssSampler(server.pid)
        ready_s = server.wait_ready()
        rss.start()
        stack.callback(rss.stop)
        rows, rows_before = [], []
        for n in counts:  # the two pods' rounds of n alternate: the machine's moods hit both
            if earlier is not None:
                rows_before.append(_run_round(earlier, n, args))
            rows += [_run_round(server, n, args, kind) for kind in protocols]
    result = _result(args, rows, rss.samples, ready_s)
    if args.before is not None:
        result |= {"before": args.before, "rounds_before": rows_before,
                   "p99_after_over_before": [_ratio(a["p99_latency_s"], b["p99_latency_s"])
                                             for a, b in zip(rows, rows_before, strict=True)]}
    path = _out_path(args, ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    _print_summary(result, path)
    return 0


def _ratio(after: float | None, before: float | None) -> float | None:
    return round(after / before, 3) if after is not None and before else None


def _paced_model(path: str) -> str:
    """The model a paced engine's file measured; a bad file ends the bench in one line."""
    from asrpool.server import pacing

    try:
        return pacing.read_profile(path).model
    except pacing.ProfileError as exc:
        raise SystemExit(f"asrpool bench server: {exc}") from None


def _out_path(args: argparse.Namespace, suffix: str) -> Path:
    """The JSON result (``.json``) or the server's output (``.log``)."""
    mode = "-paced" if args.paced_engine is not None else ""
    mode += "-process" if args.engine_process else ""
    if args.message_ms != FRAME_MS:
        mode += f"-msg{args.message_ms}ms"
    if args.gil_switch_ms is not None:
        mode += f"-gil{args.gil_switch_ms:g}ms"
    if args.batches_in_flight is not None:
        mode += f"-inflight{args.batches_in_flight}"
    if args.intake_workers:
        mode += f"-intake{args.intake_workers}"
    if args.protocols != "kyutai":
        mode += "-" + args.protocols.replace(",", "-")
    if args.before is not None:
        mode += f"-vs-{args.before}"
    return Path(args.out) / f"server-{args.model}-{args.device}-b{args.batch_size}{mode}{suffix}"


def _result(args: argparse.Namespace, rows: list[dict[str, Any]],
            rss: list[tuple[float, int]], ready_s: float) -> dict[str, Any]:
    realtime = [r["clients"] for r in rows
                if r["p99_latency_s"] is not None and r["p99_latency_s"] <= args.max_p99
                and r["clients"] <= args.batch_size]
    return {
        "benchmark": "server", "model": args.model, "device": args.device,
        "batch_size": args.batch_size, "seconds_per_client": args.seconds,
        "message_ms": args.message_ms,
        "dtype": args.dtype, "client_processes": args.client_processes,
        "engine_process": args.engine_process, "gil_switch_ms": _pods_gil_switch_ms(args),
        "paced_engine": args.paced_engine, "raw_clients": args.raw_clients,
        "batches_in_flight": args.batches_in_flight, "intake_workers": args.intake_workers,
        "torch_threads": args.torch_threads, "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "machine": platform.processor() or platform.machine(),
        "startup_to_ready_s": ready_s, "max_p99_for_realtime_s": args.max_p99,
        "wake_us": reports.wake_cost_us(),  # this machine's cost of a loop's wake-up
        "largest_realtime_clients": max(realtime, default=0), "rounds": rows,
        "rss_mib_over_time": [(round(t, 2), round(b / 2**20, 1)) for t, b in rss],
    }


def _run_round(server: _Server, clients: int, args: argparse.Namespace,
               kind: str = "kyutai") -> dict[str, Any]:
    before, cpu_before = server.metrics(), _pod_cpu_s(server.pid)
    started = time.monotonic()
    results = _run_clients(server.ws_url, clients, args) if kind == "kyutai" else \
        realtimeclients.run_group(realtimeclients.url_of(server.http_url), args.seconds,
                                  list(range(clients)))
    wall = time.monotonic() - started
    after, cpu_after = server.metrics(), _pod_cpu_s(server.pid)
    latencies = sorted(lat for r in results for lat in r["latencies"])
    frames = sum(r.get("frames", len(r["latencies"])) for r in results)
    return {
        "protocol": kind,
        "clients": clients,
        "refused": sum(r["refused"] for r in results),
        # Streams the pod ended because it fell too far behind real time (--shed-seconds).
        "shed": sum(r.get("shed", 0) for r in results),
        "frames": frames,
        "p50_latency_s": _quantile(latencies, 0.5),
        "p99_latency_s": _quantile(latencies, 0.99),
        "max_latency_s": latencies[-1] if latencies else None,
        "wall_s": wall,
        "mean_step_s": _mean_delta(before, after, "asr_model_step_duration"),
        # The rest of a step with --engine-process (None in the engine thread).
        "mean_handover_s": _mean_delta(before, after, "asr_engine_handover_seconds"),
        "mean_step_lag_s": _mean_delta(before, after, "asr_step_lag_seconds"),
        "step_lag_p99_s": _histogram_quantile(before, after, "asr_step_lag_seconds", 0.99),
        # Cores the pod used: its event loop near 1 is the pod's own ceiling.
        "pod_cpu_cores": {part: round((cpu_after[part] - cpu_before[part]) / wall, 3)
                          for part in cpu_before},
        # The loop's CPU per frame answered: everything it does for a stream-step
        # (websocket layer, decoding, results), which bench capacity's host work does not
        # all see. 80 ms over it is one loop's ceiling in streams.
        "loop_us_per_frame": _per_frame(cpu_after["event_loop"] - cpu_before["event_loop"],
                                        frames),
        # OpenAI's clients: session.created after the connect, completed after the commit.
        **_realtime_waits(results),
        "messages_per_frame": _pieces(args),
        # Cores the raw clients used (None for the websockets clients): what the pod
        # could not have on this machine.
        "client_cpu_cores": _client_cores(results, wall),
    }


def _realtime_waits(results: list[dict[str, Any]]) -> dict[str, float | None]:
    waits: dict[str, float | None] = {}
    for name in ("created_s", "completed_s"):
        values = sorted(r[name] for r in results if name in r)
        if values:
            waits |= {f"{name[:-2]}_p50_s": _quantile(values, 0.5),
                      f"{name[:-2]}_max_s": values[-1]}
    return waits


def _client_cores(results: list[dict[str, Any]], wall: float) -> float | None:
    spent = [r["cpu_s"] for r in results if "cpu_s" in r]
    return round(sum(spent) / wall, 3) if spent else None


def _pieces(args: argparse.Namespace) -> int:
    """The messages a client sends each frame in."""
    return FRAME_MS // int(args.message_ms)


def _per_frame(cpu_s: float, frames: int) -> float | None:
    return round(cpu_s * 1e6 / frames, 1) if frames else None


def _pod_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds so far of the pod's event loop (its main thread: uvicorn's), of its
    other threads (the engine thread among them, exited ones included) and of its child
    processes (an engine process, Opus lanes) that are alive now."""
    loop, whole = processes.cpu_seconds(pid, pid), processes.cpu_seconds(pid)
    children = 0.0
    for child in processes.descendants(pid):
        with contextlib.suppress(OSError):  # gone meanwhile
            children += processes.cpu_seconds(child)
    # A running loop's reading lags up to a tick behind the process's: never below 0.
    return {"event_loop": loop, "other_threads": max(0.0, whole - loop),
            "child_processes": children}


def _run_clients(url: str, clients: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    processes = max(1, min(args.client_processes, clients))
    groups = [list(range(clients))[i::processes] for i in range(processes)]
    if args.raw_clients:
        return _run_raw_clients(url, [len(group) for group in groups], args.seconds)
    pieces = _pieces(args)
    if processes == 1:
        return _client_group(url, args.seconds, pieces, groups[0])
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(processes, mp_context=context) as pool:
        done = pool.map(_client_group, [url] * processes, [args.seconds] * processes,
                        [pieces] * processes, groups)
        return [result for group in done for result in group]


def _run_raw_clients(url: str, counts: list[int], seconds: float) -> list[dict[str, Any]]:
    """:mod:`rtclients` streams, ``counts[i]`` in process ``i``; one result per process,
    in the shape of a client's (``refused``, ``latencies``)."""
    address = urllib.parse.urlsplit(url)
    host, port = address.hostname or "127.0.0.1", address.port or 80
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(len(counts), mp_context=context) as pool:
        done = pool.map(rtclients.run_in_process, [host] * len(counts), [port] * len(counts),
                        [address.path] * len(counts), counts, [seconds] * len(counts),
                        range(len(counts)))
        return list(done)


def _client_group(url: str, seconds: float, pieces: int,
                  seeds: list[int]) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(_client(url, seconds, pieces, seed)
                                           for seed in seeds)))
    return asyncio.run(run())


async def _client(url: str, seconds: float, pieces: int, seed: int) -> dict[str, Any]:
    try:
        return await _stream(url, seconds, pieces, seed)
    except InvalidStatus:  # refused before the upgrade (HTTP 429 or 503): one refusal
        return {"refused": 1, "latencies": []}


async def _stream(url: str, seconds: float, pieces: int, seed: int) -> dict[str, Any]:
    """Send real-time frames, each in ``pieces`` messages; time each frame, from its last
    piece sent, until the Step that consumed it."""
    frames = _audio(seconds, seed, pieces)
    sent: dict[int, float] = {}
    latencies: list[float] = []
    async with ws_client.connect(url, max_size=None, ping_timeout=None) as ws:
        first = msgpack.unpackb(await ws.recv())
        if first["type"] != "Ready":
            return {"refused": 1, "latencies": []}
        sender = asyncio.create_task(_send_frames(ws, frames, sent))
        try:
            while len(latencies) < len(frames):
                message = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 30))
                if message["type"] == "Error":  # shed when the pod fell behind real time
                    shed = message.get("code") == protocol.ErrorCode.OVERLOADED
                    return {"refused": 0, "latencies": latencies, "shed": int(shed)}
                if message["type"] == "Step" and message["step_idx"] in sent:
                    latencies.append(time.monotonic() - sent[message["step_idx"]])
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
    return {"refused": 0, "latencies": latencies}


async def _send_frames(ws: ws_client.ClientConnection, frames: list[list[bytes]],
                       sent: dict[int, float]) -> None:
    start = time.monotonic()
    for index, pieces in enumerate(frames):
        for number, piece in enumerate(pieces, 1):  # each when its audio has been spoken
            delay = start + (index + number / len(pieces)) * FRAME_SECONDS - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if number == len(pieces):
                sent[index + 1] = time.monotonic()  # Step.step_idx counts frames from 1
            await ws.send(piece)


def _audio(seconds: float, seed: int, pieces: int = 1,
           bank_frames: int = 50) -> list[list[bytes]]:
    """``seconds`` of 80 ms frames, each as ``pieces`` Audio messages: up to 4 s of
    distinct noise, then repeated (encoding a minute for each of hundreds of clients
    would take minutes)."""
    frames = int(seconds * SAMPLE_RATE) // FRAME
    rng = np.random.default_rng(seed)
    pcm = (0.2 * rng.standard_normal(min(frames, bank_frames) * FRAME)).astype(np.float32)
    size = FRAME // pieces
    bank = [[msgpack.packb({"type": "Audio", "pcm": pcm[j:j + size].tolist()},
                           use_single_float=True) for j in range(i, i + FRAME, size)]
            for i in range(0, len(pcm), FRAME)]
    return [bank[i % len(bank)] for i in range(frames)]


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


def _mean_delta(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    count = after.get(f"{name}_count", 0) - before.get(f"{name}_count", 0)
    total = after.get(f"{name}_sum", 0) - before.get(f"{name}_sum", 0)
    return total / count if count else None


def _histogram_quantile(before: dict[str, float], after: dict[str, float], name: str,
                        q: float) -> float | None:
    """The upper bound of the bucket holding the q-quantile of this round's samples
    (None when it is past the last finite bucket)."""
    prefix = f'{name}_bucket{{le="'
    bounds = sorted((float(k[len(prefix):-2]), after[k] - before.get(k, 0))
                    for k in after if k.startswith(prefix))
    total = bounds[-1][1] if bounds else 0
    for bound, cumulative in bounds:
        if total and cumulative >= q * total:
            return bound if bound != float("inf") else None
    return None


class _Server:
    """``asrpool serve`` of this tree, or of another one (``python_path``: a
    :func:`hostwork.package_tree` of an earlier commit)."""

    def __init__(self, args: argparse.Namespace, log: Path,
                 python_path: Path | None = None) -> None:
        self.port = processes.free_port()
        command = [sys.executable, "-m", "asrpool.cli", "serve", *_engine_args(args),
                   "--batch-size", str(args.batch_size),
                   "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning",
                   # Every client connects at once: the pod's new-streams gate (50 a second,
                   # a burst of 100) would refuse hundreds of them, and this is not its test.
                   "--new-streams-per-second", "0"]
        if args.torch_threads:
            command += ["--torch-threads", str(args.torch_threads)]
        if args.dtype:
            command += ["--dtype", args.dtype]
        if args.engine_process:
            command.append("--engine-process")
        elif python_path is None:  # this tree's pod would choose by its device (auto)
            command.append("--no-engine-process")
        if args.gil_switch_ms is not None:
            command += ["--gil-switch-ms", str(args.gil_switch_ms)]
        if args.batches_in_flight is not None:
            command += ["--engine-batches-in-flight", str(args.batches_in_flight)]
        if python_path is None:  # an earlier tree's pod has no intake processes
            command += ["--intake-workers", str(args.intake_workers)]
        log.unlink(missing_ok=True)  # this run's output alone
        self.started = time.monotonic()
        try:
            env = None if python_path is None else dict(
                os.environ, PYTHONPATH=str(python_path), PYTHONSAFEPATH="1")
            self.child = processes.spawn("asrpool serve", command, log, env=env)
        except processes.StartError as exc:
            raise SystemExit(str(exc)) from exc
        self.pid = self.child.process.pid
        self.http_url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/api/asr-streaming"

    def wait_ready(self, timeout: float = 600) -> float:
        try:
            processes.wait_until(self._ready, self.started + timeout - time.monotonic(),
                                 "asrpool serve", [self.child])
        except processes.StartError as exc:
            raise SystemExit(f"{exc} (its log: {self.child.log})") from exc
        return time.monotonic() - self.started

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2):
            return True

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        # A sample's labels may hold spaces (a paced pod's measured_on): its value is last.
        samples = (line.rsplit(" ", 1) for line in text.splitlines()
                   if line and not line.startswith("#"))
        return {name: float(value) for name, value in samples}

    def stop(self) -> None:
        self.child.stop(40)


def _engine_args(args: argparse.Namespace) -> list[str]:
    """The pod's engine: the paced stand-in of a bench capacity file, or a model."""
    if args.paced_engine is not None:
        return ["--paced-engine", args.paced_engine]
    return ["--model", args.model, "--device", args.device]


class _RssSampler:
    """The server's resident memory every half second, from /proc (Linux): its process
    and its children's (an engine process, decoders), summed."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._start = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(OSError):
                total = sum(map(processes.rss_bytes, {self.pid, *processes.descendants(self.pid)}))
                self.samples.append((time.monotonic() - self._start, total))


def _pods_gil_switch_ms(args: argparse.Namespace) -> float:
    """The pod's switch interval: the one given, else ``serve``'s default."""
    if args.gil_switch_ms is not None:
        return float(args.gil_switch_ms)
    from asrpool.server import settings

    default: float = settings.ServerSettings.model_fields["gil_switch_ms"].default
    return default


def _handover(row: dict[str, Any]) -> str:
    handover = row.get("mean_handover_s")
    return "" if handover is None else f" (+{handover * 1000:.1f}ms hand-over)"


def _print_summary(result: dict[str, Any], path: Path) -> None:
    print(f"server bench: {result['model']} b{result['batch_size']} -> {path}")
    for row in result["rounds"]:
        p50, p99 = row["p50_latency_s"], row["p99_latency_s"]
        print(f"  {row['protocol']:8s} N={row['clients']:3d}  p50={_ms(p50)}  p99={_ms(p99)}  "
              f"step={_ms(row['mean_step_s'])}{_handover(row)}  "
              f"lag p99<={_ms(row['step_lag_p99_s'])}  "
              f"refused={row['refused']}  shed={row['shed']}  "
              f"cores: {_cores(row['pod_cpu_cores'])}  "
              f"loop/frame={row['loop_us_per_frame']}us{_waits(row)}")
    rss = [mib for _, mib in result["rss_mib_over_time"]]
    if rss:
        print(f"  RSS MiB: min {min(rss)}  max {max(rss)}  median {statistics.median(rss)}")
    print(f"  largest N in real time (p99 <= {result['max_p99_for_realtime_s']} s): "
          f"{result['largest_realtime_clients']}; a thread's wake-up here costs "
          f"{result['wake_us']} us of CPU")


def _waits(row: dict[str, Any]) -> str:
    if "created_p50_s" not in row:
        return ""
    return (f"  session.created p50={_ms(row['created_p50_s'])}  "
            f"completed after commit p50={_ms(row.get('completed_p50_s'))}")


def _cores(cores: dict[str, float]) -> str:
    return (f"loop {cores['event_loop']:.2f}, threads {cores['other_threads']:.2f}, "
            f"children {cores['child_processes']:.2f}")


def _ms(value: float | None) -> str:
    return "   -   " if value is None else f"{value * 1000:6.1f}ms"
