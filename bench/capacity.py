"""Capacity benchmark: the largest batch whose whole server step holds real time.

A trial runs one pod's work per 80 ms for ``B`` real-time streams through the server's
own code: each stream's messages of the step decoded (``protocol.decode_client``, and
Opus by the stream's decoder; ``--input``: PCM in 80 ms or 1 s messages, or Opus pages,
see ``bench/intake.py``) into its per-slot buffer (``server.slots``), the engine
thread's ``engine_loop.run_batch`` (resets, markers, one batched Mimi encode + LM
step, word decoding), ``Sessions.deliver`` (protocol messages, encoded) and the
writers' outbox bookkeeping. Only the socket I/O is left out (``asrpool bench server``
measures that). The parts run one after the other, as if the event loop's work could
not overlap the engine's (both hold the GIL for most of it): a conservative bound. A
batch passes when the p99 of its timed steps (after warm-up) is under ``--max-p99-ms``
(80 ms, one frame).

The search grows the batch geometrically (x2) until a trial fails, then bisects
between the largest pass and the smallest failure, within ``--max-trials`` trials
and ``--time-budget-s``. A batch that does not fit in memory (CUDA's
OutOfMemoryError, or a state estimate over the memory available) is a failed trial:
it bounds the search. On CUDA the search runs with moshi's CUDA graphs on (as the
server runs) and again with them off; on the CPU graphs do not apply.

Beside the capacity, the host's and the engine's own ceilings at the capacity batch:
80 ms over each one's time per stream (``host_us_per_stream``: the CPU time of the
pod's threads in a step less the engine's, so that Opus decoded in lanes' children,
which the step waits for, is not counted as the pod's, nor torch's worker threads,
which spin a while after each op; ``host_p50_ms`` is the wall-clock share), and which
binds (the host's work grows with the streams, the engine's less than that on a GPU, so
these are estimates from one batch). With Opus lanes, the lanes'
children are a third ceiling: their CPU time per stream (read from ``/proc``, to its
10 ms tick over the timed steps), the streams that many children would hold with a core
each. And since the step leaves socket I/O out, what the pod's websocket layer costs for
the capacity batch's messages (``bench/sockets.py``) is added to the host work, as the
ceiling of one event loop doing both.

Writes ``bench/results/capacity-<model>-<device>[-<input>].json`` (``streams_per_gpu``:
the capacity found) and a PNG of step time against batch with the 80 ms line. The JSON
is also what ``asrpool serve --paced-engine`` paces its stand-in by (its ``model``,
``device_name`` and each batch's ``engine_p50_ms``: ``server/pacing.py``).

    asrpool bench capacity --model small --device cpu --price-per-gpu-hour 2.5
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from moshi.utils import compile as moshi_compile

from asrpool.bench import devices, intake, sockets
from asrpool.common import limits
from asrpool.server import engine, engine_loop, models, sessions, sizing, slots

FRAME_MS = 80.0
DEFAULT_INPUT = "pcm-80ms"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asrpool bench capacity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    parser.add_argument("--context", type=int, default=None, help="KV cache steps")
    parser.add_argument("--start", type=int, default=1, help="first batch tried")
    parser.add_argument("--max-batch", type=int, default=limits.MAX_SLOTS_PER_POD)
    parser.add_argument("--max-trials", type=int, default=12, help="per CUDA graphs mode")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per trial")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per trial")
    parser.add_argument("--max-p99-ms", type=float, default=FRAME_MS)
    parser.add_argument("--resolution", type=float, default=0.05,
                        help="bisection stops when failure - pass <= this fraction of pass")
    parser.add_argument("--time-budget-s", type=float, default=None,
                        help="per CUDA graphs mode: stop searching after this long "
                             "(the best pass so far counts)")
    parser.add_argument("--graphs", default=None,
                        help="CUDA graphs modes to search: on,off (default on CUDA) or on")
    parser.add_argument("--retries", type=int, default=1,
                        help="runs again a batch whose p50 holds real time but p99 does not "
                             "(noise from other processes); the fastest run counts")
    parser.add_argument("--price-per-gpu-hour", type=float, default=2.5,
                        help="dollars per GPU-hour (per machine-hour on the CPU)")
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument("--input", default=DEFAULT_INPUT, choices=intake.KINDS,
                        help="what each stream sends per step (bench/intake.py)")
    parser.add_argument("--out", default="bench/results")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    _partial_path(args).unlink(missing_ok=True)
    try:
        result = run(args)
    except devices.BadInput as exc:
        _partial_path(args).unlink(missing_ok=True)
        print(f"asrpool bench capacity: {exc}", file=sys.stderr)
        return 2
    json_path, png_path = write(result, Path(args.out))
    _partial_path(args).unlink(missing_ok=True)
    print_summary(result, json_path, png_path)
    return 0


# The search: pure, so it is tested with fake trials.


next_batch = sizing.next_batch  # the pod's own search (serve --batch-size auto) and this one


@dataclasses.dataclass
class Search:
    capacity: int
    bound: str  # latency | memory | max_batch | trials | time_budget | resolution
    rows: list[dict[str, Any]]


def search(trial: Callable[[int], dict[str, Any]], start: int, max_batch: int,
           max_trials: int, resolution: float, deadline: float | None = None) -> Search:
    """Geometric growth from ``start`` until a trial fails, then bisection."""
    largest_pass, smallest_fail, fail_kind = 0, None, "latency"
    rows: list[dict[str, Any]] = []
    batch: int | None = min(start, max_batch)
    while batch is not None:
        if len(rows) >= max_trials:
            return Search(largest_pass, "trials", rows)
        if deadline is not None and time.monotonic() > deadline:
            return Search(largest_pass, "time_budget", rows)
        row = trial(batch)
        rows.append(row)
        if row["passed"]:
            largest_pass = batch
        else:
            smallest_fail, fail_kind = batch, "memory" if row["oom"] else "latency"
        batch = next_batch(largest_pass, smallest_fail, max_batch, resolution)
    return Search(largest_pass, fail_kind if smallest_fail is not None else "max_batch", rows)


# One trial: the pod's host work and the engine, through the server's modules.


class PodStep:
    """``batch`` streams, each with one 80 ms frame per call, through the server's code."""

    def __init__(self, model: models.LoadedModel, batch: int, kind: str = DEFAULT_INPUT,
                 steps: int = 64) -> None:
        self.buffers = slots.SlotBuffers(batch)
        self.sessions = sessions.Sessions(self.buffers, resume_grace=0.0, max_pending=10_000,
                                          on_change=lambda: None)
        # batch streams in batch slots: none is None
        self.streams = cast(list[sessions.Stream], [self.sessions.open() for _ in range(batch)])
        self.engine = engine.BatchedEngine(model, batch)
        self.intake = intake.build(kind, batch, steps)
        self.calls = 0

    def close(self) -> None:
        self.intake.close()
        self.engine.close()

    def __call__(self) -> tuple[float, float, float, float]:
        """One step; seconds (whole, engine step, intake: decoding and buffering audio,
        and its host work: the CPU time of the pod's threads less the engine's)."""
        started, started_cpu = time.perf_counter(), pod_threads_cpu_s()
        self.intake.feed(self.buffers, self.calls)
        intake_s = time.perf_counter() - started
        taken = self.buffers.take()
        assert taken is not None
        engine_cpu = time.thread_time()
        output = engine_loop.run_batch(self.engine, taken)
        engine_cpu = time.thread_time() - engine_cpu
        self.sessions.deliver(output)
        for stream in self.streams:
            while stream.outbox:
                stream.mark_sent()
        self.calls += 1
        host_cpu = pod_threads_cpu_s() - started_cpu - engine_cpu
        return time.perf_counter() - started, output.duration, intake_s, host_cpu


def pod_threads_cpu_s() -> float:
    """CPU seconds of this process's Python threads: the one running the pod's step and
    any the pod started (Opus lanes' readers and writers). Not torch's own worker
    threads, which run the engine's ops and spin a while after each, on any step."""
    total = time.thread_time()
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and thread.ident is not None:
            with contextlib.suppress(OSError, ProcessLookupError):  # it has just ended
                total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return total


@dataclasses.dataclass(frozen=True)
class TrialSettings:
    steps: int
    warmup: int
    max_p99_ms: float
    graphs: bool | None  # None: not applicable (CPU)
    input: str = DEFAULT_INPUT


def trial(model: models.LoadedModel, batch: int, settings: TrialSettings,
          memory: MemoryProbe) -> dict[str, Any]:
    row: dict[str, Any] = {"batch_size": batch, "cuda_graphs": settings.graphs}
    refusal = memory.refusal(batch)
    if refusal is not None:
        return row | {"passed": False, "oom": True, "note": refusal}
    memory.before_trial()
    pod: PodStep | None = None
    try:
        with _graphs_mode(settings.graphs):
            pod = PodStep(model, batch, settings.input, settings.warmup + settings.steps)
            timings, helpers_s = _timed_steps(pod, settings)
        row |= memory.after_trial(pod.engine.state_nbytes(), batch)
    except torch.cuda.OutOfMemoryError as exc:
        note = f"CUDA out of memory: {devices.first_line(exc)}"
        row |= {"passed": False, "oom": True, "note": note}
    except RuntimeError as exc:
        if "can't allocate memory" not in str(exc):  # the CPU allocator's out of memory
            raise
        row |= {"passed": False, "oom": True, "note": devices.first_line(exc)}
    else:
        row |= _timing_row(timings, settings.max_p99_ms)
        row["host_us_per_stream"] = round(row["host_cpu_p50_ms"] * 1e3 / batch, 2)
        assert pod is not None  # the trial ran
        row |= _messages_row(pod)
        if pod.intake.helpers_cpu_s():
            row["helper_processes"] = intake.LANES
            row["helpers_us_per_stream"] = round(helpers_s * 1e6 / len(timings) / batch, 2)
    finally:
        if pod is not None:
            pod.close()
        del pod
        memory.release()
    return row


def _messages_row(pod: PodStep) -> dict[str, Any]:
    """Each stream's messages per step both ways and their sizes (what the websocket
    layer handles: ``sockets``)."""
    history = [len(message) for stream in pod.streams for message in stream.history]
    sent = sum(stream.sent for stream in pod.streams)
    return {"messages_in_per_stream_step": pod.intake.messages_per_step,
            "message_in_bytes": pod.intake.message_bytes,
            "messages_out_per_stream_step": round(sent / pod.calls / len(pod.streams), 3),
            "message_out_bytes": sorted(history)[len(history) // 2] if history else 0}


def with_sockets(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """``row`` with what its messages cost the pod's websocket layer per stream-step
    (``bench/sockets.py``, measured now): the host work ``bench capacity`` leaves out."""
    if row is None or "messages_in_per_stream_step" not in row:
        return row
    costs = sockets.socket_costs(row["message_in_bytes"], max(row["message_out_bytes"], 1))
    per_stream = (row["messages_in_per_stream_step"] * costs["receive_us"]
                  + row["messages_out_per_stream_step"] * costs["send_us"])
    return row | {"sockets": costs, "socket_us_per_stream": round(per_stream, 2)}


def trial_again_if_noisy(model: models.LoadedModel, batch: int, settings: TrialSettings,
                        memory: MemoryProbe, retries: int) -> dict[str, Any]:
    """A trial whose median holds real time but whose p99 does not is run again (up to
    ``retries`` times) and the fastest run counts: other processes only ever add time,
    while a batch that is really too large fails every run."""
    row = trial(model, batch, settings, memory)
    runs = [row]
    while (len(runs) <= retries and not row["passed"] and not row["oom"]
           and row["step_p50_ms"] < settings.max_p99_ms):
        runs.append(trial(model, batch, settings, memory))
        row = min(runs, key=lambda r: r["step_p99_ms"])
    return row | {"runs": len(runs), "p99_ms_of_runs": [r.get("step_p99_ms") for r in runs]}


Timings = list[tuple[float, float, float, float]]  # whole, engine, intake, host CPU (s)


def _timed_steps(pod: PodStep, settings: TrialSettings) -> tuple[Timings, float]:
    """The timed steps, and the CPU seconds the intake's helper processes used in them."""
    for _ in range(settings.warmup):
        pod()
    timings: Timings = []
    helpers_s = pod.intake.helpers_cpu_s()
    for _ in range(settings.steps):
        timings.append(pod())
        if len(timings) >= 3 and min(t[0] for t in timings) * 1e3 > 5 * settings.max_p99_ms:
            break  # hopeless: every step is five times too slow; stop paying for it
    return timings, pod.intake.helpers_cpu_s() - helpers_s


def _timing_row(timings: Timings, max_p99_ms: float) -> dict[str, Any]:
    whole = sorted(t[0] * 1e3 for t in timings)
    model_ms = statistics.median(t[1] for t in timings) * 1e3
    intake_ms = statistics.median(t[2] for t in timings) * 1e3
    p50, p99 = statistics.median(whole), _quantile(whole, 0.99)
    return {"passed": p99 < max_p99_ms, "oom": False, "steps": len(whole),
            "step_p50_ms": round(p50, 3), "step_p99_ms": round(p99, 3),
            "step_max_ms": round(whole[-1], 3), "engine_p50_ms": round(model_ms, 3),
            "intake_p50_ms": round(intake_ms, 3),
            "host_p50_ms": round(p50 - model_ms, 3),
            "host_cpu_p50_ms": round(statistics.median(t[3] for t in timings) * 1e3, 3),
            "realtime_factor_p50": round(FRAME_MS / p50, 3)}


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile (with 40 steps, the p99 is the slowest step)."""
    index = min(len(sorted_values) - 1, max(0, int(np.ceil(q * len(sorted_values))) - 1))
    return sorted_values[index]


@contextlib.contextmanager
def _graphs_mode(graphs: bool | None) -> Iterator[None]:
    if graphs is False:
        with moshi_compile.no_cuda_graph():
            yield
    else:
        yield


# Memory: what a trial may allocate, and what it did.


class MemoryProbe:
    """Refuses batches whose state cannot fit, and reads what each trial used.

    On the CPU nothing would stop an oversized batch before it swaps, so the estimate
    keeps a margin over the state. On CUDA the estimate is the state, then the peak per
    slot measured by the trials, and a batch that still does not fit raises
    OutOfMemoryError, which the trial reports.
    """

    def __init__(self, device: torch.device, state_bytes_per_slot: float) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.safety = 1.0 if self.cuda else 1.5
        self.bytes_per_slot = state_bytes_per_slot
        self.state_bytes_per_slot = state_bytes_per_slot  # of a batch-1 engine
        self.model_bytes = torch.cuda.memory_allocated(device) if self.cuda else None

    def available(self) -> int:
        if self.cuda:
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free)
        return sizing.memory_available(self.device)

    def total(self) -> int | None:
        return int(torch.cuda.mem_get_info(self.device)[1]) if self.cuda else None

    def refusal(self, batch: int) -> str | None:
        need = batch * self.bytes_per_slot * self.safety
        have = self.available()
        if need <= have:
            return None
        return (f"batch {batch} needs about {need / 2**30:.1f} GiB "
                f"({self.bytes_per_slot / 2**20:.1f} MiB per slot, x{self.safety}), "
                f"{have / 2**30:.1f} GiB is free")

    def before_trial(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def after_trial(self, state_bytes: int, batch: int) -> dict[str, Any]:
        row: dict[str, Any] = {"state_bytes": state_bytes,
                               "state_bytes_per_slot": state_bytes // batch}
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
            row |= {"gpu_peak_allocated_bytes": peak,
                    "gpu_peak_reserved_bytes": torch.cuda.max_memory_reserved(self.device),
                    "gpu_bytes_per_slot": (peak - (self.model_bytes or 0)) // batch}
            self.bytes_per_slot = max(self.bytes_per_slot,
                                      (peak - (self.model_bytes or 0)) / batch)
        return row

    def release(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


state_bytes_per_slot = sizing.state_bytes_per_slot

# Wiring: arguments to a result.


def graph_modes(device: torch.device, requested: str | None) -> list[bool | None]:
    if device.type != "cuda":
        return [None]
    names = (requested or "on,off").split(",")
    if any(n not in ("on", "off") for n in names):
        raise devices.BadInput(f"--graphs takes on, off or on,off, not {requested!r}")
    return [n == "on" for n in names]


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.start < 1 or args.max_batch < args.start:
        raise devices.BadInput(f"need 1 <= --start <= --max-batch, got {args.start}, "
                            f"{args.max_batch}")
    device = devices.resolve(args.device)
    modes = graph_modes(device, args.graphs)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    started = time.monotonic()
    model = devices.load_model(args.model, device, args.context)
    memory = MemoryProbe(device, state_bytes_per_slot(model))
    searches = {mode: _search_mode(model, memory, mode, args) for mode in modes}
    return _result(args, device, model, memory, searches, time.monotonic() - started)




def _search_mode(model: models.LoadedModel, memory: MemoryProbe, graphs: bool | None,
                 args: argparse.Namespace) -> Search:
    budget = args.time_budget_s
    deadline = None if budget is None else time.monotonic() + budget
    settings = TrialSettings(args.steps, args.warmup, args.max_p99_ms, graphs, args.input)

    def one(batch: int) -> dict[str, Any]:
        row = trial_again_if_noisy(model, batch, settings, memory, args.retries)
        _write_partial(args, row)
        return row

    found = search(one, args.start, args.max_batch, args.max_trials, args.resolution, deadline)
    if found.rows and found.rows[0]["oom"] and not any(r["passed"] for r in found.rows):
        first = found.rows[0]
        hint = "; try a smaller --start" if first["batch_size"] > 1 else ""
        raise devices.BadInput(f"batch {first['batch_size']} does not fit in memory "
                            f"({first['note']}){hint}")
    return found


def _partial_path(args: argparse.Namespace) -> Path:
    model = str(args.model).replace("/", "_")
    return Path(args.out) / f"capacity-{model}-{args.device.split(':')[0]}.partial.jsonl"


def _write_partial(args: argparse.Namespace, row: dict[str, Any]) -> None:
    """Each trial as it ends, so a run killed by a deadline still leaves its rows."""
    path = _partial_path(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(row) + "\n")


def _result(args: argparse.Namespace, device: torch.device, model: models.LoadedModel,
            memory: MemoryProbe, searches: dict[bool | None, Search],
            elapsed: float) -> dict[str, Any]:
    main_mode = True if True in searches else next(iter(searches))
    capacity = searches[main_mode].capacity
    rows = [row for found in searches.values() for row in found.rows]
    at_capacity = with_sockets(next((r for r in searches[main_mode].rows
                                     if r["batch_size"] == capacity and r["passed"]), None))
    return {
        "benchmark": "capacity", "model": args.model, "device": device.type,
        "device_name": _device_name(device), "dtype": str(models.default_dtype(device)),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(), "load_average_at_end": os.getloadavg(),
        "context": model.lm.context, "max_p99_ms": args.max_p99_ms,
        "steps_per_trial": args.steps, "warmup_steps": args.warmup, "retries": args.retries,
        "start": args.start, "max_batch": args.max_batch, "max_trials": args.max_trials,
        "input": args.input, "streams_per_gpu": capacity, "bound": searches[main_mode].bound,
        "ceilings": ceilings(at_capacity),
        "cuda_graphs": _graphs_summary(device, searches),
        "memory": _memory_summary(memory, at_capacity),
        "price_per_gpu_hour": args.price_per_gpu_hour,
        "cents_per_audio_hour": cents_per_audio_hour(args.price_per_gpu_hour, capacity),
        "elapsed_s": round(elapsed, 1), "batches": rows,
    }


def ceilings(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """Streams that 80 ms of host work, 80 ms of engine work and (with Opus lanes) 80 ms
    of each helper process's work would each hold, at the rate per stream of ``row`` (the
    capacity batch), and which is the smallest."""
    if row is None:
        return None
    batch = row["batch_size"]
    host_ms = row["host_cpu_p50_ms"]
    limits = {"host": FRAME_MS * batch / host_ms if host_ms > 0 else None,
              "engine": (FRAME_MS * batch / row["engine_p50_ms"]
                         if row["engine_p50_ms"] > 0 else None)}
    helpers_us = row.get("helpers_us_per_stream")
    if helpers_us:
        limits["helpers"] = FRAME_MS * 1e3 * row["helper_processes"] / helpers_us
    known = {part: streams for part, streams in limits.items() if streams is not None}
    binds = min(known, key=known.__getitem__) if len(known) == len(limits) else None
    result = {"at_batch": batch, "host_us_per_stream": row.get("host_us_per_stream"),
              **{f"{part}_streams": None if streams is None else int(streams)
                 for part, streams in limits.items()}, "binds": binds}
    if helpers_us:
        result |= {"helpers_us_per_stream": helpers_us,
                   "helper_processes": row["helper_processes"]}
    socket_us = row.get("socket_us_per_stream")
    if socket_us is not None and row.get("host_us_per_stream"):
        # One event loop does both: the host work and the websocket layer.
        whole = row["host_us_per_stream"] + socket_us
        result |= {"socket_us_per_stream": socket_us, "sockets": row.get("sockets"),
                   "host_with_sockets_us_per_stream": round(whole, 2),
                   "host_with_sockets_streams": int(FRAME_MS * 1e3 / whole)}
    return result


def cents_per_audio_hour(price_per_gpu_hour: float, streams: int) -> float | None:
    """A GPU serving ``streams`` real-time streams transcribes that many audio hours
    per hour."""
    return None if streams <= 0 else round(100 * price_per_gpu_hour / streams, 4)


def _graphs_summary(device: torch.device, searches: dict[bool | None, Search]) -> dict[str, Any]:
    if device.type != "cuda":
        return {"applies": False,
                "note": f"CUDA graphs do not apply on {device.type}: one search, no graphs"}
    return {"applies": True, **{("on" if mode else "off"): {
        "streams": found.capacity, "bound": found.bound} for mode, found in searches.items()}}


def _memory_summary(memory: MemoryProbe, at_capacity: dict[str, Any] | None) -> dict[str, Any]:
    row = at_capacity or {}
    return {"source": "torch.cuda memory stats" if memory.cuda else "engine.state_nbytes()",
            "state_bytes_per_slot": row.get("state_bytes_per_slot",
                                            int(memory.state_bytes_per_slot)),
            "state_bytes_at_capacity": row.get("state_bytes"),
            "gpu_bytes_per_slot": row.get("gpu_bytes_per_slot"),
            "gpu_peak_allocated_bytes_at_capacity": row.get("gpu_peak_allocated_bytes"),
            "gpu_model_bytes": memory.model_bytes, "gpu_total_bytes": memory.total()}


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


# Output.


def file_stem(result: dict[str, Any]) -> str:
    model = str(result["model"]).replace("/", "_")
    kind = result.get("input", DEFAULT_INPUT)
    return f"capacity-{model}-{result['device']}" + ("" if kind == DEFAULT_INPUT else f"-{kind}")


def write(result: dict[str, Any], out: Path) -> tuple[Path, Path | None]:
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{file_stem(result)}.json"
    json_path.write_text(json.dumps(result, indent=2))
    return json_path, plot(result, out / f"{file_stem(result)}.png")


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Step p50/p99 against batch, per CUDA graphs mode, with the real-time line."""
    try:
        import matplotlib
    except ImportError:
        print("asrpool bench capacity: matplotlib is not installed (pip install "
              "'asrpool[bench]'); no plot", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.ticker
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for mode in sorted({r["cuda_graphs"] for r in result["batches"]}, key=str):
        rows = sorted((r for r in result["batches"] if r["cuda_graphs"] == mode
                       and not r["oom"]), key=lambda r: r["batch_size"])
        label = {True: "graphs on", False: "graphs off", None: ""}[mode]
        batches = [r["batch_size"] for r in rows]
        axes.plot(batches, [r["step_p50_ms"] for r in rows], "o-", label=f"p50 {label}")
        axes.plot(batches, [r["step_p99_ms"] for r in rows], "s--", label=f"p99 {label}")
    for row in (r for r in result["batches"] if r["oom"]):
        axes.axvline(row["batch_size"], color="grey", linestyle=":", linewidth=1)
    axes.axhline(result["max_p99_ms"], color="red", label=f"{result['max_p99_ms']:g} ms")
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    slowest = max((r["step_p99_ms"] for r in result["batches"] if not r["oom"]), default=0)
    axes.set_ylim(0, max(2 * result["max_p99_ms"], min(slowest, 5 * result["max_p99_ms"])) * 1.05)
    axes.set_xlabel("batch (streams)")
    axes.set_ylabel("whole server step (ms)")
    axes.set_title(f"{result['model']} on {result['device_name']}: "
                   f"{result['streams_per_gpu']} streams ({result['bound']} bound)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path


def print_summary(result: dict[str, Any], json_path: Path, png_path: Path | None) -> None:
    print(f"capacity: {result['model']} on {result['device']} ({result['device_name']}) "
          f"-> {json_path}" + (f", {png_path}" if png_path else ""))
    for r in result["batches"]:
        mode = {True: "graphs on ", False: "graphs off", None: ""}[r["cuda_graphs"]]
        if r["oom"]:
            print(f"  B={r['batch_size']:5d} {mode} does not fit: {r['note']}")
            continue
        print(f"  B={r['batch_size']:5d} {mode} p50 {r['step_p50_ms']:7.1f} ms  "
              f"p99 {r['step_p99_ms']:7.1f} ms  host {r['host_p50_ms']:5.1f} ms "
              f"(audio intake {r['intake_p50_ms']:5.1f})  "
              f"{'pass' if r['passed'] else 'FAIL'}")
    cents = result["cents_per_audio_hour"]
    print(f"  streams per {result['device']}: {result['streams_per_gpu']} "
          f"({result['bound']} bound); "
          + (f"{cents:.3f} cents per audio-hour at ${result['price_per_gpu_hour']}/h"
             if cents is not None else "no cost (no stream fits)"))
    limits = result.get("ceilings")
    if limits:
        print(f"  at B={limits['at_batch']}: host {limits['host_us_per_stream']} us per stream"
              f" (ceiling {limits['host_streams']} streams), engine ceiling "
              f"{limits['engine_streams']} streams"
              + (f", {limits['helper_processes']} lanes' children "
                 f"{limits['helpers_us_per_stream']} us per stream (ceiling "
                 f"{limits['helpers_streams']} streams)" if "helpers_streams" in limits else "")
              + f": the {limits['binds']} binds")
        if "socket_us_per_stream" in limits:
            print(f"  the websocket layer adds {limits['socket_us_per_stream']} us per stream "
                  f"(bench/sockets.py): host with sockets "
                  f"{limits['host_with_sockets_us_per_stream']} us, ceiling "
                  f"{limits['host_with_sockets_streams']} streams on one event loop")
    if not result["cuda_graphs"]["applies"]:
        print(f"  {result['cuda_graphs']['note']}")
