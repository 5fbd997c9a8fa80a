"""``bench/gpu-check`` end to end, on the CPU with the tiny model and small settings.

The same script runs on a lent GPU with its defaults; here it must go through every
stage (isolation, capacity, a server at the capacity found), write its results and
exit 0. Marked ``gpu_check`` (about a minute; deselect with ``-m 'not gpu_check'``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asrpool.common import processes

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu-check"


def _run(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=240)


@pytest.mark.gpu_check
@pytest.mark.timeout(300)
def test_gpu_check_runs_every_stage_on_the_cpu(tmp_path: Path) -> None:
    done = _run("--device", "cpu", "--model", "tiny", "--isolation-batch", "4",
                "--isolation-steps", "40", "--isolation-context", "12", "--max-batch", "2",
                "--steps", "3", "--warmup", "1", "--server-seconds", "1",
                "--client-processes", "1", "--torch-threads", "1", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "gpu-check-cpu.json").read_text())
    assert [s["stage"] for s in summary["stages"]] == [
        "isolation", "capacity tiny", "server tiny x2 engine process, intake processes",
        "server tiny x2 engine process", "server tiny x2 engine thread"]
    assert all(s["rc"] == 0 for s in summary["stages"])
    assert summary["capacity"]["tiny"]["streams_per_gpu"] == 2
    for mode, served in summary["server"].items():  # each way, side by side
        # The winner at the live rounds (512 to 1,024 clients, at most the 2 slots), the
        # others at quarters of the 2 slots, once.
        assert [r["clients"] for r in served["rounds"]] == (
            [2] if mode == "engine process, intake processes" else [1, 2])
        assert all(r["refused"] == 0 and r["frames"] > 0 for r in served["rounds"])
        assert all(r["pod_cpu_cores"]["event_loop"] > 0 for r in served["rounds"])
        assert served["wake_us"] > 0
    assert set(summary["server"]) == {"engine process, intake processes", "engine process",
                                      "engine thread"}
    assert json.loads((tmp_path / "isolation-tiny-cpu.json").read_text())["ok"] is True
    assert (tmp_path / "capacity-tiny-cpu.png").exists()
    assert "gpu-check summary" in done.stdout and "pod cores: event loop" in done.stdout


def test_the_server_stage_tries_quarters_of_the_capacity() -> None:
    script: Any = _load_script()
    assert script.live_rounds(768) == [512, 768]
    assert script.live_rounds(1024) == [512, 768, 1024]
    assert script.live_rounds(2048) == [512, 768, 1024]
    assert script.client_rounds(768) == [192, 384, 576, 768]
    assert script.client_rounds(6) == [1, 3, 4, 6]
    assert script.client_rounds(1) == [1]


def test_gpu_check_without_a_gpu_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = _run("--device", "cuda", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "no CUDA device" in done.stderr
    assert "summary" not in done.stdout


def test_gpu_check_says_how_to_install_when_asrpool_is_missing(tmp_path: Path) -> None:
    """Run by an interpreter without asrpool (the system one, isolated from site paths)."""
    env = {"PATH": os.environ.get("PATH", "")}
    done = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "asrpool is not importable" in line and "pip install -e" in line


def _children(pid: int) -> list[int]:
    return [child for child, parent in processes.parents().items() if parent == pid]


@pytest.mark.gpu_check
def test_sigterm_ends_the_running_stage_too(tmp_path: Path) -> None:
    """The stages run in their own process groups; stopping the check must stop them."""
    import signal

    check = processes.spawn(
        "bench/gpu-check",
        [sys.executable, str(SCRIPT), "--device", "cpu", "--model", "tiny",
         "--isolation-steps", "5000", "--out", str(tmp_path)], tmp_path / "gpu-check.log")
    try:
        stages: list[int] = []

        def started() -> bool:
            stages[:] = _children(check.process.pid)
            return bool(stages)

        processes.wait_until(started, 60, "the isolation stage", [check])
        check.process.send_signal(signal.SIGTERM)  # to the check alone, not its group
        assert check.process.wait(60) == 128 + signal.SIGTERM
        assert not Path(f"/proc/{stages[0]}").exists()
    finally:
        check.stop(10)


def _load_script() -> object:
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(("isolation_rc", "exit_code"), [(1, 1), (0, 3), (None, 3)])
def test_a_failed_isolation_is_exit_1_and_other_failures_exit_3(
    isolation_rc: int | None, exit_code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stages faked: isolation as given, capacity writes no result (so no server run)."""
    script: Any = _load_script()

    def fake_run(self: Any, name: str, argv: list[str], timeout: float) -> int | None:
        self.records.append({"stage": name, "rc": isolation_rc if name == "isolation" else 1})
        return isolation_rc if name == "isolation" else 1

    monkeypatch.setattr(script.Stages, "run", fake_run)
    assert script.main(["--device", "cpu", "--out", str(tmp_path)]) == exit_code
    summary = json.loads((tmp_path / "gpu-check-cpu.json").read_text())
    assert summary["capacity"] == {"stt-1b-en_fr": None, "stt-2.6b-en": None}
