"""A control plane whose starter dies (a test run killed before its teardown) stops."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster import conftest
from tests.support.processes import running_with

pytestmark = pytest.mark.timeout(180)


def test_the_cluster_stops_when_the_process_that_started_it_dies(tmp_path: Path) -> None:
    bin_dir = conftest._build()
    up = [sys.executable, "-m", "asrpool_harness.localcluster",
          "--kubeconfig", str(tmp_path / "kc"), "--bin-dir", str(bin_dir),
          "--workdir", str(tmp_path / "state"), "--exit-with-parent"]
    # The starter: runs `up`, says when it is ready, then waits to be killed.
    starter = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         f"p = subprocess.Popen({up!r}, stdout=subprocess.PIPE, text=True)\n"
         "print(p.stdout.readline().strip(), flush=True)\ntime.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert starter.stdout is not None
    assert starter.stdout.readline().strip() == "ready"
    assert running_with(str(tmp_path / "state"))  # etcd, the API server, ...
    starter.send_signal(signal.SIGKILL)
    starter.wait()
    deadline = time.monotonic() + 90
    while running_with(str(tmp_path / "state")):
        assert time.monotonic() < deadline, running_with(str(tmp_path / "state"))
        time.sleep(0.5)
