"""The servers of the parity run: Kyutai's moshi-server, an asrpool pod, and a router.

moshi-server is Kyutai's Rust server (the ``moshi-server`` crate), built once per
machine with ``cargo install --locked`` at a pinned version into a cache outside the
repository (``~/.cache/asrpool/moshi-server/VERSION``) and run from there on the CPU.
The asrpool pod is ``asrpool serve`` on the shared checkpoint's directory, with the
same API key; the router runs in front of a second such pod (a pod behind a router
takes the router's pod token instead of API keys) with Redis, as ``asrpool up`` runs
them. Each is started only while its catalogue runs (two cores), bound to 127.0.0.1
on a free port, through :mod:`asrpool.common.processes`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from asrpool.client import local
from asrpool.common import auth, processes, protocol
from asrpool_harness.bench import parity_configs, parity_weights

PINNED_VERSION = "0.6.4"  # the newest on crates.io, kyutai-labs/moshi's HEAD
MOSHI_SERVER, POD, ROUTER = "moshi-server", "asrpool pod", "router"
STOP_TIMEOUT = 15.0
START_TIMEOUT = 300.0  # a loaded two-core machine loads and warms a model slowly


class InstallError(RuntimeError):
    """moshi-server could not be built; the message names the log."""


def default_cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "asrpool" / "moshi-server"


def binary_path(cache: Path, version: str) -> Path:
    return cache / version / "bin" / "moshi-server"


def install_argv(cache: Path, version: str) -> list[str]:
    """cargo's command for a CPU build (no cuda or metal feature) of ``version``, at
    its own lock file's dependency versions, into ``cache/version``; niced, since the
    build takes both cores for a long while."""
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    return [*nice, "cargo", "install", "--locked", "moshi-server", "--version", version,
            "--root", str(cache / version)]


def ensure_installed(cache: Path, version: str) -> Path:
    """The moshi-server binary, built first if the cache lacks it."""
    binary = binary_path(cache, version)
    if binary.is_file():
        return binary
    if shutil.which("cargo") is None:
        raise InstallError("moshi-server is not built and there is no cargo: install Rust "
                           "(rustup) or run `make parity`")
    log = cache / f"build-{version}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"building moshi-server {version} with cargo (the first build took 46 minutes "
          f"on two busy cores); log: {log}", flush=True)
    started = time.monotonic()
    with log.open("ab") as out:
        done = subprocess.run(install_argv(cache, version), stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0 or not binary.is_file():
        raise InstallError(f"cargo install moshi-server {version} failed ({done.returncode}):"
                           f" see {log}")
    print(f"built moshi-server in {(time.monotonic() - started) / 60:.0f} min", flush=True)
    return binary


@dataclasses.dataclass(frozen=True)
class Target:
    """A server the catalogue runs against."""

    name: str
    http_url: str  # http://127.0.0.1:PORT
    api_key: str
    # GET /api/modules_info: the module whose used_slots tell that the server is idle.
    module_type: str = "batched_asr"

    @property
    def ws_url(self) -> str:
        return "ws" + self.http_url.removeprefix("http") + protocol.STREAMING_PATH

    def modules_info(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.http_url + "/api/modules_info", timeout=5) as answer:
            modules: list[dict[str, Any]] = json.loads(answer.read())
        return modules

    def used_slots(self) -> int:
        return sum(int(module.get("used_slots", 0)) for module in self.modules_info())

    def wait_idle(self, timeout: float = 60.0) -> None:
        processes.wait_until(lambda: self.used_slots() == 0, timeout,
                             f"{self.name}'s slots to be free")


def write_key_file(path: Path, api_key: str) -> Path:
    path.write_text(yaml.safe_dump({"keys": [{"id": "parity", "sha256": auth.hash_key(api_key)}]}))
    return path


@contextlib.contextmanager
def moshi_server(binary: Path, shared: parity_weights.SharedCheckpoint, workdir: Path,
                 batch_size: int, api_key: str) -> Iterator[Target]:
    config = parity_configs.moshi_server_config(
        lm_file=shared.lm_file, mimi_file=shared.mimi_file,
        tokenizer_file=shared.tokenizer_file, lm_kwargs=shared.preset.lm_kwargs,
        asr_delay_in_tokens=shared.asr_delay_in_tokens, batch_size=batch_size,
        api_key=api_key, workdir=workdir)
    for folder in ("static", "logs"):
        (workdir / folder).mkdir(parents=True, exist_ok=True)
    path = workdir / "moshi-server.toml"
    path.write_text(parity_configs.to_toml(config))
    port = processes.free_port()
    argv = [str(binary), "worker", "--config", str(path), "--addr", processes.LOOPBACK,
            "--port", str(port), "--cpu", "--silent"]
    target = Target(MOSHI_SERVER, f"http://{processes.LOOPBACK}:{port}", api_key)
    with _running(MOSHI_SERVER, argv, workdir, target, os.environ):
        yield target


@contextlib.contextmanager
def asrpool_pod(shared: parity_weights.SharedCheckpoint, workdir: Path, batch_size: int,
                api_key: str) -> Iterator[Target]:
    port = processes.free_port()
    argv = [sys.executable, "-m", "asrpool.cli", "serve", "--model", str(shared.asrpool),
            "--batch-size", str(batch_size), "--host", processes.LOOPBACK, "--port", str(port),
            "--torch-threads", "1"]
    env = {**os.environ, "ASRPOOL_API_KEYS_FILE": str(write_key_file(workdir / "keys.yaml",
                                                                      api_key))}
    target = Target(POD, f"http://{processes.LOOPBACK}:{port}", api_key)
    with _running("pod", argv, workdir, target, env, ready_path="/readyz"):
        yield target


@contextlib.contextmanager
def router(shared: parity_weights.SharedCheckpoint, workdir: Path, batch_size: int,
           api_key: str) -> Iterator[Target]:
    """Redis, one pod and a router (``asrpool up``'s platform), the router behind the key."""
    env = {"ASRPOOL_API_KEYS_FILE": str(write_key_file(workdir / "keys.yaml", api_key)),
           "ASRPOOL_POD_TOKEN": secrets.token_urlsafe(24)}
    port = processes.free_port()
    with processes.inherited_environment(env), \
            local.LocalPlatform(1, batch_size, str(shared.asrpool), port):
        yield Target(ROUTER, f"http://{processes.LOOPBACK}:{port}", api_key)


@contextlib.contextmanager
def _running(name: str, argv: list[str], workdir: Path, target: Target,
             env: Any, ready_path: str = "/api/modules_info") -> Iterator[None]:
    child = processes.spawn(name, argv, workdir / f"{name}.log", env=env)
    try:
        processes.wait_until(lambda: _http_ok(target.http_url + ready_path), START_TIMEOUT,
                             name, [child])
        yield
    finally:
        child.stop(STOP_TIMEOUT)


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as answer:
        return bool(answer.status == 200)
