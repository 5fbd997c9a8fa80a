"""A control plane whose starter dies (a test run killed before its teardown) stops."""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path

import pytest

from asrpool.common import processes
from tests.cluster import conftest
from tests.support import processes as support
from tests.support.processes import running_with

pytestmark = pytest.mark.timeout(180)


def test_the_cluster_stops_when_the_process_that_started_it_dies(tmp_path: Path) -> None:
    bin_dir = conftest._build()
    up = [sys.executable, "-m", "asrpool_harness.localcluster",
          "--kubeconfig", str(tmp_path / "kc"), "--bin-dir", str(bin_dir),
          "--workdir", str(tmp_path / "state"), "--exit-with-parent"]
    # The starter: runs `up`, says when it is ready, then waits to be killed.
    starter = processes.spawn(
        "the starter",
        [sys.executable, "-c", "import subprocess, sys, time\n"
         f"p = subprocess.Popen({up!r}, stdout=subprocess.PIPE, text=True)\n"
         "print('up:', p.stdout.readline().strip(), flush=True)\ntime.sleep(600)\n"],
        tmp_path / "starter.log")
    try:
        said = support.wait_printed(starter, r"up:\s*(.*)", 150)  # up's stderr is there too
        assert said.group(1) == "ready"
        assert running_with(str(tmp_path / "state"))  # etcd, the API server, ...
        starter.process.send_signal(signal.SIGKILL)
        starter.process.wait()
        with contextlib.suppress(processes.StartError):
            processes.wait_until(lambda: not running_with(str(tmp_path / "state")), 90,
                                 "the cluster's end", period=0.5)
        assert not running_with(str(tmp_path / "state")), running_with(str(tmp_path / "state"))
    finally:
        starter.stop(10)
