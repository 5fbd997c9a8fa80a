"""What ``asrpool.common.processes`` reads from /proc: liveness, resident memory and CPU
time."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

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


def test_cpu_time_counts_a_threads_work_in_the_thread_and_in_its_process() -> None:
    pid = os.getpid()
    main_before, whole_before = processes.cpu_seconds(pid, pid), processes.cpu_seconds(pid)
    spun: list[float] = []

    def spin() -> None:
        started = time.thread_time()
        while time.thread_time() - started < 0.3:
            pass
        spun.append(time.thread_time() - started)

    worker = threading.Thread(target=spin)
    worker.start()
    worker.join()  # exited: its time stays in the process's
    whole = processes.cpu_seconds(pid) - whole_before
    main = processes.cpu_seconds(pid, pid) - main_before
    assert whole - main >= spun[0] - 0.01  # a running thread's reading lags a tick
    assert main < 0.2  # the main thread only waited


def test_cpu_time_is_finer_than_a_clock_tick() -> None:
    """A frame's work on the event loop is tens of microseconds: a reading in 10 ms
    ticks showed a short bench round's loop as idle (it did, in CI)."""
    pid = os.getpid()
    spun: list[float] = []
    tids: list[int] = []
    done_spinning, go = threading.Event(), threading.Event()

    def spin() -> None:
        tids.append(threading.get_native_id())
        go.wait()  # running, so that "before" below counts none of the spin
        started = time.thread_time()
        while time.thread_time() - started < 0.002:
            pass
        spun.append(time.thread_time() - started)
        done_spinning.set()
        time.sleep(0.5)  # asleep: its scheduler statistics are up to date

    worker = threading.Thread(target=spin)
    worker.start()
    while not tids:
        time.sleep(0.001)
    thread_before, whole_before = processes.cpu_seconds(pid, tids[0]), processes.cpu_seconds(pid)
    go.set()
    done_spinning.wait()
    time.sleep(0.05)
    assert abs(processes.cpu_seconds(pid, tids[0]) - thread_before - spun[0]) < 0.001
    assert processes.cpu_seconds(pid) - whole_before >= spun[0]
    worker.join()


def test_cpu_time_of_a_process_that_is_gone_is_an_error() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(OSError):
        processes.cpu_seconds(child.pid)
