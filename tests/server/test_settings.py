"""``asrpool serve`` settings: flags over ``ASRPOOL_*`` environment variables over defaults."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from asrpool.server import serve_cli
from tests.support import servers


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_flags_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASRPOOL_BATCH_SIZE", "3")
    monkeypatch.setenv("ASRPOOL_POOL", "green")
    monkeypatch.setenv("ASRPOOL_DRAIN_GRACE_SECONDS", "12.5")
    config = serve_cli.settings_from(_parse("--batch-size", "5", "--port", "9000"))
    assert (config.batch_size, config.pool, config.port) == (5, "green", 9000)
    assert config.drain_grace_seconds == 12.5


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ASRPOOL_PORT", "ASRPOOL_POOL", "ASRPOOL_ADVERTISE_ADDRESS", "ASRPOOL_HOST"):
        monkeypatch.delenv(name, raising=False)
    config = serve_cli.settings_from(_parse("--host", "10.1.2.3"))
    assert (config.port, config.pool, config.address) == (8080, "default", "10.1.2.3:8080")
    assert config.max_message_bytes == 16 << 20  # moshi-server's frame limit
    assert config.resume_grace_seconds == 30 and config.idle_timeout_seconds == 120
    assert (config.ping_interval_seconds, config.ping_timeout_seconds) == (10, 10)
    assert config.gil_switch_ms == 0.2 and config.engine_process is None
    assert not config.in_engine_process  # on a CPU, the engine in the pod's own thread


@pytest.mark.parametrize(("flags", "expected"), [
    (["--device", "cuda"], True), (["--device", "cuda:1"], True),
    (["--paced-engine", "capacity.json"], True), (["--device", "cpu"], False),
    (["--device", "cuda", "--no-engine-process"], False),
    (["--device", "cpu", "--engine-process"], True),
])
def test_the_engine_runs_in_a_process_beside_a_gpu_unless_told(flags: list[str],
                                                               expected: bool) -> None:
    assert serve_cli.settings_from(_parse(*flags)).in_engine_process is expected


def test_cli_module_does_not_import_torch_or_fastapi() -> None:
    code = ("import sys; from asrpool.server import serve_cli; "
            "print(sorted({'torch', 'fastapi', 'uvicorn'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_invalid_setting_is_a_clear_error() -> None:
    result = subprocess.run([sys.executable, "-m", "asrpool.cli", "serve", "--batch-size", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2  # the one convention: stderr, exit 2
    assert "batch_size (--batch-size or ASRPOOL_BATCH_SIZE)" in result.stderr


def test_a_pod_switches_the_gil_as_often_as_told(tmp_path: Path) -> None:
    """The interval is the process's own (``sys.getswitchinterval`` in its ready line)."""
    with servers.ServerProcess(tmp_path, args=["--gil-switch-ms", "0.5"]) as server:
        server.wait_ready()
        assert "the engine in a thread, GIL switch 0.5 ms" in server.log()
    refused = subprocess.run([sys.executable, "-m", "asrpool.cli", "serve", "--gil-switch-ms",
                              "0"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "gil_switch_ms (--gil-switch-ms or ASRPOOL_GIL_SWITCH_MS)" in refused.stderr


def test_the_dtype_follows_the_one_policy_unless_given() -> None:
    from asrpool.server import models, settings

    assert settings.ServerSettings().dtype == "auto"
    assert str(models.default_dtype("cuda")) == "torch.bfloat16"
    assert str(models.default_dtype("cpu")) == "torch.float32"
    with pytest.raises(ValueError, match="dtype"):
        settings.ServerSettings(dtype="int8")
