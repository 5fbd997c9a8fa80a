"""Real containers from the project's images, run by podman with runc.

Every container a test starts has a unique name and is removed (``podman rm -f``) when
the test ends; none reaches anything but loopback.
"""

from __future__ import annotations

import contextlib
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from asrpool.common import processes

RUN_TIMEOUT = 300.0
START_TIMEOUT = 90.0

# The chart's securityContext, as podman spells it: a read-only root with nothing
# writable but what is mounted (podman's own tmpfs on /tmp, /run is off), every
# capability dropped, no privilege escalation.
LOCKED_DOWN = ["--read-only", "--read-only-tmpfs=false", "--cap-drop=all",
               "--security-opt=no-new-privileges", "--runtime=runc"]
# No network unless a test names one (the host's, bound to loopback): podman's default
# bridge would give containers addresses in 10.88.0.0/16, a range tests never use.
NO_NETWORK = ["--network", "none"]


def network(options: Sequence[str]) -> list[str]:
    return [] if any(o == "--network" or o.startswith("--network=") for o in options) \
        else NO_NETWORK


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


def podman(*args: str, timeout: float = RUN_TIMEOUT) -> Done:
    done = subprocess.run(["podman", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)
    return Done(done.returncode, done.stdout, done.stderr)


def unique_name(prefix: str) -> str:
    return f"asrpool-test-{prefix}-{uuid.uuid4().hex[:8]}"


def run(image: str, command: Sequence[str], options: Sequence[str] = (),
        entrypoint: str | None = None, timeout: float = RUN_TIMEOUT) -> Done:
    """Run a container to its end (removed afterwards) and return its output."""
    name = unique_name("run")
    chosen = ["--entrypoint", entrypoint] if entrypoint is not None else []
    try:
        return podman("run", "--name", name, *LOCKED_DOWN, *network(options), *options,
                      *chosen, image, *command, timeout=timeout)
    finally:
        remove(name)


@contextlib.contextmanager
def started(image: str, command: Sequence[str], options: Sequence[str] = (),
            entrypoint: str | None = None) -> Iterator[str]:
    """A detached container, yielded by name, removed when the block ends."""
    name = unique_name("svc")
    chosen = ["--entrypoint", entrypoint] if entrypoint is not None else []
    done = podman("run", "--detach", "--name", name, *LOCKED_DOWN, *network(options), *options,
                  *chosen, image, *command)
    try:
        assert done.returncode == 0, done.stderr[-2000:]
        yield name
    finally:
        remove(name)


def remove(name: str) -> None:
    podman("rm", "--force", "--time", "2", name, timeout=60)


def logs(name: str) -> str:
    done = podman("logs", name, timeout=30)
    return (done.stdout + done.stderr)[-3000:]


def is_running(name: str) -> bool:
    done = podman("inspect", "--format", "{{.State.Running}}", name, timeout=30)
    return done.stdout.strip() == "true"


@contextlib.contextmanager
def volume(prefix: str) -> Iterator[str]:
    """A podman named volume (filled from the image's folder on first mount, owner kept)."""
    name = unique_name(prefix)
    done = podman("volume", "create", name, timeout=60)
    assert done.returncode == 0, done.stderr
    try:
        yield name
    finally:
        podman("volume", "rm", "--force", name, timeout=60)


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


def wait_for_http(name: str, url: str) -> None:
    """Until ``url`` answers 200; fail at once, with the container's log, if it exits."""
    def answers() -> bool:
        if not is_running(name):
            raise processes.StartError(f"container {name} exited")
        return get(url)[0] == 200

    try:
        processes.wait_until(answers, START_TIMEOUT, f"{url} in container {name}")
    except processes.StartError as error:
        pytest.fail(f"{error}: {logs(name)}")
