"""The pause image: Kubernetes' pause.c, compiled here, holds a sandbox and exits on
SIGTERM as the kubelet expects."""

from __future__ import annotations

from tests.images import containers
from tests.images.conftest import Built


def test_pause_holds_until_sigterm_then_exits_cleanly(images: dict[str, Built]) -> None:
    with containers.started(images["pause"].name, [], ["--network", "none"]) as name:
        assert containers.is_running(name)
        stopped = containers.podman("stop", "--time", "10", name, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        code = containers.podman("inspect", "--format", "{{.State.ExitCode}}", name)
        assert code.stdout.strip() == "0", containers.logs(name)


def test_pause_is_one_static_file_run_as_nobody(images: dict[str, Built]) -> None:
    done = containers.podman("image", "inspect", "--format", "{{.Config.User}} {{.Size}}",
                             images["pause"].name)
    user, size = done.stdout.split()
    assert user == "65535:65535"
    assert int(size) < 2_000_000
    version = containers.run(images["pause"].name, ["-v"])
    assert version.returncode == 0 and version.stdout.startswith("pause.c v"), version.stderr
