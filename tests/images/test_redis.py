"""The Redis image with the chart's own command and probe: the users and their passwords
on standard input, the default user off, uid 999, `redis-cli ping` answering PONG only
with REDISCLI_AUTH."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from asrpool.common import processes
from tests.chart import rendering
from tests.images import containers
from tests.images.conftest import Built

UID = 999
START_TIMEOUT = 30.0


def chart_redis_container() -> dict[str, Any]:
    manifests = rendering.render({"redis": {"enabled": True, "auth": {"enabled": True}}})
    (statefulset,) = rendering.find(manifests, "StatefulSet")
    return rendering.container(statefulset)


def probe_command(container: dict[str, Any]) -> list[str]:
    command: list[str] = container["readinessProbe"]["exec"]["command"]
    return command


@pytest.fixture(scope="module")
def chart_container() -> dict[str, Any]:
    return chart_redis_container()


PASSWORDS = {"OPERATOR_PASSWORD": secrets.token_hex(16), "ROUTER_PASSWORD": secrets.token_hex(16)}


@pytest.fixture
def redis(images: dict[str, Built], chart_container: dict[str, Any]) -> Iterator[str]:
    """The image started as the chart starts it (its command and args, the users'
    passwords in OPERATOR_PASSWORD, ROUTER_PASSWORD and, for the probe, REDISCLI_AUTH),
    on a network of its own (loopback only)."""
    values = {**PASSWORDS, "REDISCLI_AUTH": PASSWORDS["OPERATOR_PASSWORD"]}
    assert {e["name"] for e in chart_container["env"]} == set(values)
    env = [f"--env={name}={value}" for name, value in values.items()]
    (entrypoint, *command) = [*chart_container["command"], *chart_container["args"]]
    options = ["--network", "none", "--volume", "/data", *env]
    with containers.started(images["redis"].name, command, options, entrypoint) as name:
        wait_for_pong(name, probe_command(chart_container))
        yield name


def wait_for_pong(name: str, probe: list[str]) -> None:
    def answers() -> bool:
        if containers.podman("exec", name, *probe, timeout=30).stdout.strip() == "PONG":
            return True
        if not containers.is_running(name):
            raise processes.StartError(f"container {name} exited")
        return False

    try:
        processes.wait_until(answers, START_TIMEOUT, f"redis in container {name}")
    except processes.StartError:
        pytest.fail(f"redis never answered PONG: {containers.logs(name)}")


def test_the_chart_probe_answers_pong(redis: str, chart_container: dict[str, Any]) -> None:
    done = containers.podman("exec", redis, *probe_command(chart_container))
    assert (done.returncode, done.stdout.strip()) == (0, "PONG")


def test_redis_requires_the_password_from_standard_input(
        redis: str, chart_container: dict[str, Any]) -> None:
    probe = " ".join(probe_command(chart_container))
    done = containers.podman("exec", redis, "sh", "-c", f"unset REDISCLI_AUTH; exec {probe}")
    assert "NOAUTH" in done.stdout + done.stderr


def test_the_default_user_is_off_and_the_router_user_is_no_admin(redis: str) -> None:
    default = containers.podman("exec", redis, "sh", "-c", "unset REDISCLI_AUTH; redis-cli ping")
    assert "NOAUTH" in default.stdout + default.stderr
    router = ["redis-cli", "--user", "asrpool-router", "--pass", PASSWORDS["ROUTER_PASSWORD"],
              "--no-auth-warning"]
    assert containers.podman("exec", redis, *router, "ping").stdout.strip() == "PONG"
    refused = containers.podman("exec", redis, *router, "acl", "list")
    assert "NOPERM" in refused.stdout + refused.stderr


def test_redis_server_runs_as_uid_999_with_no_password_in_its_arguments(redis: str) -> None:
    done = containers.podman("exec", redis, "sh", "-c",
                             "grep -E '^(Uid|Gid):' /proc/1/status; tr '\\0' ' ' < /proc/1/cmdline")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[1:] == [str(UID)] * 4
    assert lines[1].split()[1:] == [str(UID)] * 4
    assert lines[2].startswith("redis-server")
    assert not any(password in lines[2] for password in PASSWORDS.values())
