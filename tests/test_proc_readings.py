"""What ``asrpool.common.processes`` reads from /proc: liveness and resident memory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from asrpool.common import processes


def test_a_running_process_is_alive_and_has_resident_memory() -> None:
    assert processes.alive(os.getpid())
    assert processes.rss_bytes(os.getpid()) > 1 << 20


def test_a_zombie_is_not_alive_and_holds_no_memory_and_a_reaped_one_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert not processes.alive(child.pid)
    assert processes.rss_bytes(child.pid) == 0
    child.wait()
    assert not processes.alive(child.pid)
    with pytest.raises(OSError):
        processes.rss_bytes(child.pid)
