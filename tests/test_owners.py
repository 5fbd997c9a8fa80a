"""Child processes, ports and Redis clients have owners, and no product or benchmark
module does their job by hand (a twin that misses what the owner was fixed for):

- ``asrpool.common.processes`` starts the programs that run beside us
  (``spawn``: their own session, their output in a log, ``Child.stop``: SIGTERM, then
  SIGKILL of the whole group) and picks ports (``free_port``: below the kernel's
  ephemeral range, where an outgoing connection may take a port that a bind to port 0
  handed out before its server binds it);
- ``asrpool.common.redis_clients`` opens Redis clients (``connect``, ``connect_sync``:
  a deadline on every call, one retry).

So outside them, no module calls ``Popen`` or ``asyncio.create_subprocess_exec`` /
``_shell``, binds a socket to port 0, or builds a Redis client (``Redis(...)``,
``StrictRedis(...)``, ``RedisCluster(...)``, ``ConnectionPool(...)``, or ``from_url``
of any of them or of the ``redis`` modules). Calls are matched by name, as written.

The tests start their servers, daemons, browsers, operators and clusters the same way
(``processes.spawn``, ``processes.wait_until``, ``Child.stop``): no test calls ``Popen``
or ``asyncio.create_subprocess_*`` either. (Their own Redis clients are the tests' own.)

Allowed everywhere: a one-shot ``subprocess.run`` / ``check_output`` / ``check_call`` of
a short tool, which returns when the tool has ended (nothing is left to stop), and a
server's bind to the port it was given. A place that must hold a child by hand is in
``ALLOWED`` with why; an entry no longer needed fails the test too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("asrpool", "server", "router", "operator", "bench", "plan", "harness")
# the pyprojects' folders
SCRIPTS = (ROOT / "bench" / "gpu-check",)  # Python without the .py (ruff and mypy check it)
TESTS = ROOT / "tests"

POPEN = "Popen"
ASYNC_PROCESS = "asyncio.create_subprocess_*"
PORT_0 = "bind to port 0"
REDIS = "a Redis client"
TEST_KINDS = {POPEN, ASYNC_PROCESS}  # what the tests leave to the owners too
USE = {
    POPEN: "processes.spawn",
    ASYNC_PROCESS: "processes.spawn",
    PORT_0: "processes.free_port",
    REDIS: "redis_clients.connect or connect_sync",
}
REDIS_CLASSES = {"Redis", "StrictRedis", "RedisCluster", "ConnectionPool"}
REDIS_NAMES = {"redis", "aioredis"} | REDIS_CLASSES  # what a redis from_url is called on

# What each file may do by hand, and why.
ALLOWED = {
    # The owners.
    ROOT / "asrpool" / "common" / "processes.py": {POPEN, PORT_0},
    ROOT / "asrpool" / "common" / "redis_clients.py": {REDIS},
    # The upload decoder: a one-shot child fed the body on its stdin and read from its
    # stdout under a deadline, in the event loop (asyncio's subprocess.run with input).
    ROOT / "server" / "decoding.py": {ASYNC_PROCESS},
    # The Opus lanes: long-lived children fed on their stdin by a writer thread and read
    # on their stdout by a reader thread, for the pod's whole life (no log file).
    ROOT / "server" / "opuslanes.py": {POPEN},
    # The intake processes: long-lived children handed their end of a socket pair and a
    # shared memory file by descriptor (pass_fds), for the pod's whole life; their
    # output is the pod's own (its log).
    ROOT / "server" / "intake.py": {POPEN},
    # tar streams an image into ctr's stdin, both ended within the call: a pipe between
    # two one-shot tools.
    ROOT / "harness" / "asrpool_harness" / "localcluster" / "containerd.py": {POPEN},
    # Each stage runs in the foreground with the check's own output (what a GPU run
    # shows as it goes), not into a log; past its time processes.terminate stops it.
    ROOT / "bench" / "gpu-check": {POPEN},
    # The subject is a specific child's /proc readings: as a zombie (exited, not yet
    # reaped: waitid with WNOWAIT on the Popen's pid) and once reaped.
    TESTS / "test_proc_readings.py": {POPEN},
    # The pid of a child that has ended and been reaped (subprocess.run does not say it).
    TESTS / "cluster" / "test_diskspace.py": {POPEN},
}


def twins(source: str) -> list[tuple[int, str]]:
    """(line, kind) of each call in ``source`` that does an owner's job, in line order."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            kind = _kind(node)
            if kind is not None:
                found.append((node.lineno, kind))
    return sorted(found)


def _kind(call: ast.Call) -> str | None:
    *bases, name = _dotted(call.func)
    if name == "Popen":
        return POPEN
    if name in ("create_subprocess_exec", "create_subprocess_shell"):
        return ASYNC_PROCESS
    if name == "bind" and call.args and _port_is_zero(call.args[0]):
        return PORT_0
    if name in REDIS_CLASSES or (name == "from_url" and REDIS_NAMES & set(bases)):
        return REDIS
    return None


def _dotted(node: ast.expr) -> list[str]:
    """``a.b.c`` as ``["a", "b", "c"]``; what is not a name (a call's result) as ``"?"``."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [*_dotted(node.value), node.attr]
    return ["?"]


def _port_is_zero(address: ast.expr) -> bool:
    return (isinstance(address, ast.Tuple) and len(address.elts) >= 2
            and isinstance(port := address.elts[1], ast.Constant)
            and type(port.value) is int and port.value == 0)


def _sources() -> list[Path]:
    return [*(path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))),
            *SCRIPTS]


def test_the_scanner_finds_each_twin_and_not_one_shot_tools_or_text() -> None:
    source = (
        "import asyncio, socket, subprocess\n"
        "import redis, redis.asyncio as aioredis\n"
        "child = subprocess.Popen(['redis-server'])\n"
        "async def decode() -> None:\n"
        "    await asyncio.create_subprocess_exec('ffmpeg')\n"
        "with socket.socket() as sock:\n"
        "    sock.bind(('127.0.0.1', 0))\n"
        "a = aioredis.Redis.from_url('redis://h')\n"
        "b = redis.Redis(host='h')\n"
        "c = redis.asyncio.from_url('redis://h')\n"
        "d = aioredis.ConnectionPool.from_url('redis://h')\n"
        "subprocess.run(['true'], check=True, timeout=5)\n"
        "sock.bind((host, port))\n"
        "sock.bind(('127.0.0.1', False))\n"
        "e = Settings.from_url('redis://h')\n"
        "note = 'subprocess.Popen in a string'  # and Redis.from_url in a comment\n"
        "f = redis_clients.connect('redis://h', 0.5)\n"
    )
    assert twins(source) == [(3, POPEN), (5, ASYNC_PROCESS), (7, PORT_0), (8, REDIS),
                             (9, REDIS), (10, REDIS), (11, REDIS)]


def test_no_module_but_the_owners_starts_a_process_picks_a_port_or_opens_redis() -> None:
    found = []
    for path in _sources():
        allowed = ALLOWED.get(path, set())
        for line, kind in twins(path.read_text()):
            if kind not in allowed:
                found.append(f"{path.relative_to(ROOT)}:{line}: {kind} (use {USE[kind]})")
    assert found == []


def test_no_test_starts_a_process_but_through_spawn() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        allowed = ALLOWED.get(path, set())
        for line, kind in twins(path.read_text()):
            if kind in TEST_KINDS and kind not in allowed:
                found.append(f"{path.relative_to(ROOT)}:{line}: {kind} (use {USE[kind]})")
    assert found == []


def test_every_allowed_place_still_needs_it() -> None:
    unused = []
    for path, kinds in ALLOWED.items():
        used = {kind for _, kind in twins(path.read_text())}
        unused += [f"{path.relative_to(ROOT)}: {kind}" for kind in sorted(kinds - used)]
    assert unused == []
