"""The control image as the chart runs it: uid 10001, a read-only root, no HOME; the
router serves HTTP from a real container with a real Redis, with one worker and two."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import pytest

from asrpool.common import processes
from tests.images import containers
from tests.images.conftest import Built
from tests.support import redis_servers

UID = 10001


@pytest.fixture
def control(images: dict[str, Built]) -> str:
    return images["control"].name


@pytest.mark.parametrize("command", [[], ["route"], ["operator"]])
def test_each_command_answers_help(control: str, command: list[str]) -> None:
    done = containers.run(control, [*command, "--help"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: asrpool"), done.stdout[:200]


def test_it_runs_as_uid_10001_with_a_read_only_root_and_no_home(control: str) -> None:
    done = containers.run(
        control, ["-c", 'id -u; id -g; echo "home=$HOME"; test -e "$HOME" || echo no-home; '
                  "touch /written 2>&1 || echo root-read-only; "
                  "touch /tmp/written 2>&1 || echo tmp-read-only"], entrypoint="sh")
    lines = done.stdout.splitlines()
    assert lines[:2] == [str(UID), str(UID)], done.stdout + done.stderr
    assert "no-home" in lines
    assert "root-read-only" in lines and "tmp-read-only" in lines
    assert "Read-only file system" in done.stdout


# One worker needs nothing writable; more share their metrics through a folder under
# /tmp (prometheus_client's multiprocess mode), which the chart must mount (an emptyDir).
ONE_WORKER = ["--env", "ASRPOOL_WORKERS=1"]
TWO_WORKERS = ["--env", "ASRPOOL_WORKERS=2", "--tmpfs", "/tmp:rw,size=16m,mode=1777"]


@pytest.fixture
def router(control: str, module_redis: redis_servers.RedisServer,
           request: pytest.FixtureRequest) -> Iterator[str]:
    """``asrpool route`` in a container on the host's network, bound to 127.0.0.1 only,
    with the options the test asks for (indirect parametrisation); yields its URL."""
    options: Sequence[str] = getattr(request, "param", ONE_WORKER)
    port = processes.free_port()
    command = ["route", "--host", "127.0.0.1", "--port", str(port),
               "--redis-url", module_redis.url]
    with containers.started(control, command, ["--network", "host", *options]) as name:
        url = f"http://127.0.0.1:{port}"
        containers.wait_for_http(name, f"{url}/healthz")
        yield url
        stop_with_sigterm(name)


def stop_with_sigterm(name: str) -> None:
    """podman stop sends SIGTERM to the container's PID 1; the router exits 0 in time."""
    stopped = containers.podman("stop", "--time", "30", name, timeout=90)
    assert stopped.returncode == 0, stopped.stderr
    code = containers.podman("inspect", "--format", "{{.State.ExitCode}}", name)
    assert code.stdout.strip() == "0", containers.logs(name)


def test_the_router_answers_health_and_readiness_over_http(router: str) -> None:
    healthy = json.dumps({"ok": True}, separators=(",", ":"))
    assert containers.get(f"{router}/healthz") == (200, healthy)
    status, _ = containers.get(f"{router}/readyz")  # ready: it reached Redis
    assert status == 200


@pytest.mark.parametrize("router", [TWO_WORKERS], indirect=True)
def test_two_router_workers_run_with_a_tmpfs_at_tmp(router: str) -> None:
    status, _ = containers.get(f"{router}/readyz")
    assert status == 200
    status, metrics = containers.get(f"{router}/metrics")
    assert status == 200 and "asrpool_router" in metrics
