"""The server pod's settings: flags of ``asrpool serve`` or ``ASRPOOL_*`` environment variables.

Each field's ``description`` is its ``--help`` (asrpool.common.settings_cli).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Literal

import pydantic

from asrpool.common import (
    crd,
    dtypes,
    limits,
    logs,
    protocol,
    redis_clients,
    registry,
    settings_cli,
)
from asrpool.server import decoding

_WILDCARD_HOSTS = {"0.0.0.0", "::", ""}


MAX_BATCH_SIZE = limits.MAX_SLOTS_PER_POD
GPU_INTAKE_WORKERS = limits.GPU_INTAKE_WORKERS


def _slots_or_auto(value: object) -> int | Literal["auto"]:
    """``--batch-size``: a whole number of slots, or ``auto`` (one message for both)."""
    if value == "auto":
        return "auto"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH_SIZE:
        raise ValueError(f"must be a whole number from 1 to {MAX_BATCH_SIZE}, or auto; got "
                         f"{value!r}")
    return value


SlotsOrAuto = Annotated[int | Literal["auto"], pydantic.PlainValidator(_slots_or_auto)]


class ServerSettings(redis_clients.RedisSettings, logs.LogSettings, limits.LimitSettings,
                     limits.StreamSettings):
    # The model and its engine.
    model: str = pydantic.Field(
        default="tiny", description="tiny | small | stt-1b-en_fr | stt-2.6b-en | <dir> | <hf repo>")
    model_revision: str | None = pydantic.Field(
        default=None, description="Hugging Face revision of --model (branch, tag or commit)")
    batch_size: SlotsOrAuto = pydantic.Field(  # a pool's slotsPerPod default, from its CRD
        default_factory=lambda: crd.default(crd.pool_spec(), "slotsPerPod"),
        json_schema_extra={settings_cli.SHOW_DEFAULT: True},
        description="stream slots (rows of the batched engine); auto: the largest "
        "batch whose step the pod measures within --auto-step-budget-ms at start-up")
    # --batch-size auto (server.sizing): what the measured step may take of a frame's 80
    # ms (the rest is the host's: hand-over, intake, delivery), the largest batch tried,
    # and how long the search may take.
    auto_step_budget_ms: float = pydantic.Field(
        default=64.0, gt=0, le=80, description="with --batch-size auto: the p99 step "
        "(every slot busy) that the chosen batch keeps within")
    auto_max_batch: int = pydantic.Field(
        default=1024, ge=1, le=MAX_BATCH_SIZE,
        description="with --batch-size auto: the largest batch tried")
    auto_seconds: float = pydantic.Field(
        default=60.0, gt=0, description="with --batch-size auto: how long the search may "
        "take (the largest batch within budget by then is served)")
    context: int | None = pydantic.Field(
        default=None, ge=1, description="rolling KV cache length in steps (default: the model's)")
    device: str = pydantic.Field(default="cpu", description="torch device (cpu, cuda, cuda:1)")
    # "auto" is the one dtype policy (models.default_dtype): bfloat16 on CUDA, else float32.
    dtype: dtypes.Dtype = pydantic.Field(
        default=dtypes.AUTO, description="auto is bfloat16 on CUDA, float32 elsewhere")
    torch_threads: int | None = pydantic.Field(
        default=None, ge=1, description="CPU intra-op threads for torch (default: torch's)")
    # A rehearsal of the host path at GPU scale without a GPU (server.pacing): every part
    # of the pod runs, but the model's forward is a stand-in timed by a bench capacity
    # result; the file names the model, and --device, --dtype and --context do not apply.
    paced_engine: Path | None = pydantic.Field(
        default=None, description="a bench capacity JSON: stand in for its model's forward "
        "with the measured step time of --batch-size (no weights, no GPU; never a model)")

    # Where it listens and how the platform finds it.
    host: str = pydantic.Field(default="0.0.0.0", description="address to listen on")
    port: int = pydantic.Field(default=8080, ge=0, le=65535, description="port to listen on")
    redis_url: str | None = pydantic.Field(
        default=None, description="heartbeat into this Redis, the slot registry (none: a pod"
        f" alone; {redis_clients.URL_FORMS})")
    pool: str = pydantic.Field(
        default=registry.DEFAULT_POOL, description="pool name (the operator sets NAMESPACE/NAME)")
    pod_id: str = pydantic.Field(
        default_factory=socket.gethostname,
        description="pod id in the registry (default: the hostname; the operator sets"
        " NAMESPACE/NAME)")
    # Off where a pod's Redis user reaches only its own namespace's keys (the operator's
    # Redis ACLs): the operator adds the pool as it lists the pool's pods.
    announce_pool: bool = pydantic.Field(
        default=True, description="add the pool to the registry's set of pools with each beat")
    advertise_address: str | None = pydantic.Field(
        default=None, description="host:port routers dial (default: host:port, the hostname if"
        " host is a wildcard)")
    heartbeat_interval_seconds: float = pydantic.Field(
        default=0.5, gt=0, description="Redis heartbeat period")
    heartbeat_lease_ms: int = pydantic.Field(
        default=registry.DEFAULT_LEASE_MS, ge=100,
        description="a heartbeat counts this long; a pod silent longer is gone")

    # Who may connect.
    api_keys_file: Path | None = pydantic.Field(
        default=None, description="hashed API key file; clients then need a key")
    # A secret, so never a flag (ps shows every process's arguments): the variable only,
    # which the operator sets from the pool's Secret.
    pod_token: pydantic.SecretStr | None = pydantic.Field(
        default=None, description="shared secret routers send in asrpool-pod-token")

    # Per-stream limits and timers.
    max_buffer_seconds: float = pydantic.Field(
        default=10.0, gt=0, description="per-slot audio cap (backpressure)")
    # Message sizes and client liveness: limits.StreamSettings. As moshi-server, a
    # client is idle after 120 s without a binary message.
    max_pending_messages: int = pydantic.Field(
        default=10_000, ge=16, description="results of one stream waiting to be sent at most")
    # One client cannot stall its neighbours (asrpool.server.budgets): messages per
    # second per connection (a frame's worth of audio is free), and markers waiting for
    # their audio per stream (one per 80 ms chunk with the buffer full is ~130).
    max_messages_per_second: float = pydantic.Field(
        default=250.0, gt=0,
        description="per connection; audio messages of 1920+ samples are free")
    message_burst: float = pydantic.Field(
        default=2500.0, ge=1, description="messages a connection may save up")
    max_pending_markers: int = pydantic.Field(
        default=256, ge=1, description="markers per stream waiting for their audio")
    idle_timeout_seconds: float = pydantic.Field(
        default=120.0, gt=0, description="drop a client sending no audio for this long")
    drain_grace_seconds: float = pydantic.Field(
        default=30.0, ge=0, description="SIGTERM: open streams may finish for this long")
    # What a connection may cost: limits.LimitSettings; a pod's connections must stay
    # above its slots plus probes.
    # New streams per second of this process (0: no limit), refused with HTTP 429 before
    # the upgrade: churn costs the event loop, and so the engine's steps (the GIL).
    new_streams_per_second: float = pydantic.Field(
        default=50.0, ge=0, description="new streams per second of the process (else HTTP 429;"
        " 0: any number)")
    new_streams_burst: float = pydantic.Field(
        default=100.0, ge=1, description="new streams the process may save up")
    # OggOpus decoding beside the event loop (server.opuslanes): sphn holds the GIL for
    # some 50 us per 40 ms page, which one event loop pays for every stream otherwise.
    opus_workers: int = pydantic.Field(
        default=0, ge=0, le=64, description="child processes decoding streams' OggOpus "
        "(0: on the event loop)")
    # Streams' messages read, checked and answered beside the event loop (server.intake):
    # the loop keeps each stream's life, the processes its messages.
    intake_workers: int | None = pydantic.Field(
        default=None, ge=0, le=64, description="child processes that read, check and answer "
        "the streams' websocket messages after the pod accepts them (0: on the event loop); "
        f"unset, {GPU_INTAKE_WORKERS} where the device is a GPU or the engine a paced "
        "stand-in, 0 on a CPU")
    # The engine beside the event loop, not under its GIL (server.enginechild): the first
    # H200 run's pod of 768 slots kept up with 256 clients in one process, not 512.
    engine_process: bool | None = pydantic.Field(
        default=None, description="run the model in a child process of its own (for "
        "hundreds of streams per GPU; the pod's event loop then shares no GIL with it); "
        "unset, on where the device is a GPU or the engine a paced stand-in, off on a CPU")
    # With --engine-process, the next batch is handed over while the child steps the last
    # (server.enginechild): at 1,024 paced H200 slots, one at a time kept real time for 512
    # clients on two cores, two in flight for 768.
    engine_batches_in_flight: int = pydantic.Field(
        default=2, ge=1, le=2, description="with --engine-process, batches handed to the "
        "child at a time: 2 overlaps a batch's hand-over with the step before, 1 hands "
        "over one at a time (less latency at light load)")
    warmup_steps: int = pydantic.Field(
        default=2, ge=0, description="engine steps run before the pod is ready")
    # The engine thread lets the GIL go for every torch op and then waits for it while
    # the event loop holds it: Python's 5 ms per wait, dozens of waits a step
    # (harness/asrpool_harness/bench/gil.py), or the hand-over's two waits with --engine-process.
    gil_switch_ms: float = pydantic.Field(
        default=0.2, gt=0, le=1000, description="the process's GIL switch interval: the "
        "longest a thread waits while another holds the GIL (Python's default: 5)")

    # A pod that falls behind real time protects the streams it has (server.overload):
    # it admits no new stream, and past a hard bound sheds its newest ones.
    overload_seconds: float = pydantic.Field(
        default=1.0, ge=0, description="behind real time this far, admit no new stream "
        "until caught up (overloaded in the heartbeat, asr_overloaded 1; 0: never refuse)")
    shed_seconds: float = pydantic.Field(
        default=5.0, ge=0, description="behind real time this far and still falling behind, "
        "end the newest streams (Error overloaded), a sixteenth at a time (0: never)")

    # POST /api/asr-streaming: each file is decoded in a child process (server.decoding)
    # bounded by these, so no upload costs the pod more than its share.
    max_upload_seconds: float = pydantic.Field(
        default=3600.0, gt=0, description="longest audio a POSTed file may hold (else HTTP 413)")
    decode_memory_bytes: int = pydantic.Field(
        default=4 << 30, ge=256 << 20,
        description="address space of the child process decoding one upload (else 413)")
    decode_timeout_seconds: float = pydantic.Field(
        default=120.0, gt=0, description="longest decode of one upload (else 413)")

    @property
    def address(self) -> str:
        """What routers dial: the advertised address, or host:port (hostname if wildcard)."""
        if self.advertise_address:
            return self.advertise_address
        host = socket.gethostname() if self.host in _WILDCARD_HOSTS else self.host
        return f"{host}:{self.port}"

    @property
    def decode_limits(self) -> decoding.Limits:
        return decoding.Limits(self.max_upload_seconds, self.decode_memory_bytes,
                               self.decode_timeout_seconds)

    @property
    def in_engine_process(self) -> bool:
        """``engine_process``, or where unset, where it wins: beside a GPU's engine (or
        the paced stand-in of one), whose hundreds of streams the event loop must not
        stall by holding the GIL; not on a CPU, whose engine wants the cores itself."""
        if self.engine_process is not None:
            return self.engine_process
        return self.device.startswith("cuda") or self.paced_engine is not None

    def asks_no_key(self) -> bool:
        """Neither API keys nor a pod token: anyone who reaches the port may stream."""
        return self.api_keys_file is None and self.pod_token is None

    @property
    def intake_processes(self) -> int:
        """``intake_workers``, or where unset, where they win: beside a GPU's engine (or
        its paced stand-in), whose hundreds of streams one event loop cannot read; not
        on a CPU, whose engine wants the cores itself."""
        if self.intake_workers is not None:
            return self.intake_workers
        beside_a_gpu = self.device.startswith("cuda") or self.paced_engine is not None
        return GPU_INTAKE_WORKERS if beside_a_gpu else 0

    @property
    def slots(self) -> int:
        """The batch size, once known: ``--batch-size auto`` is measured before the pod
        is built (``sizing``, ``serve``), which then gets settings with the number."""
        if self.batch_size == "auto":
            raise ValueError("--batch-size auto is measured before the pod starts")
        return self.batch_size

    @property
    def max_buffer_samples(self) -> int:
        return int(self.max_buffer_seconds * protocol.SAMPLE_RATE)
