"""tools/images/build: every image builds from the local base, is tagged with the names
the chart uses, and is reported with its real ID; a cached rebuild changes nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.images import containers
from tests.images.conftest import BUILD, IMAGES, ROOT, Built
from tests.support import imagebuilds


def inspect(name: str, field: str) -> str:
    done = containers.podman("image", "inspect", "--format", field, name, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def chart_version() -> str:
    for line in (ROOT / "charts" / "asrpool" / "Chart.yaml").read_text().splitlines():
        if line.startswith("appVersion:"):
            return line.split(":", 1)[1].strip().strip('"')
    raise AssertionError("no appVersion in Chart.yaml")


def test_every_image_builds_and_is_reported_with_its_id(images: dict[str, Built]) -> None:
    assert set(images) == set(IMAGES)
    for built in images.values():
        assert inspect(built.name, "{{.Id}}").startswith(built.id)


def test_the_images_carry_the_names_the_chart_pulls(images: dict[str, Built]) -> None:
    version = chart_version()
    assert images["control"].name == f"ghcr.io/asrpool/asrpool-control:{version}"
    assert images["server"].name == f"ghcr.io/asrpool/asrpool:{version}"
    assert inspect("localhost/asrpool/redis:7.0", "{{.Id}}").startswith(images["redis"].id)
    pause = images["pause"].name
    assert pause.startswith("localhost/asrpool/pause:")
    tag = pause.rsplit(":", 1)[1]
    assert inspect(f"registry.k8s.io/pause:{tag}", "{{.Id}}").startswith(images["pause"].id)


def test_the_python_images_build_from_the_local_bookworm_base(images: dict[str, Built]) -> None:
    """Debian's python3 in /usr/bin (the public python images have theirs in /usr/local)."""
    for image in ("control", "server", "redis"):
        done = containers.run(images[image].name,
                              ["sh", "-c", "cat /etc/os-release; ls /usr/bin/python3"],
                              entrypoint="")
        assert done.returncode == 0, done.stderr
        assert "VERSION_CODENAME=bookworm" in done.stdout
        assert "/usr/bin/python3" in done.stdout


def test_no_ca_bundle_is_left_in_an_image_but_debians_own(images: dict[str, Built]) -> None:
    """The host's bundle is mounted into RUN steps only: the image's file is Debian's."""
    host = Path("/etc/ssl/certs/ca-certificates.crt").read_text()
    for image in ("control", "server"):
        done = containers.run(images[image].name, ["cat", "/etc/ssl/certs/ca-certificates.crt"],
                              entrypoint="")
        assert done.returncode == 0, done.stderr
        assert done.stdout != host


def test_a_second_build_is_cached_and_keeps_the_ids(images: dict[str, Built]) -> None:
    done = subprocess.run([str(BUILD), "control", "redis", "pause"], capture_output=True,
                          text=True, timeout=600, check=False,
                          env=imagebuilds.build_environment())
    assert done.returncode == 0, done.stderr[-2000:]
    for line in done.stdout.splitlines():
        image, _, image_id = line.split()[:3]
        assert image_id == images[image].id, line


def test_the_tests_build_on_the_cached_base_without_asking_the_mirror(
        images: dict[str, Built]) -> None:
    """ASRPOOL_IMAGES_BASE=cached: a mirror that cannot be reached is never asked (one
    that published a new snapshot mid-suite would rebuild every image)."""
    env = {**imagebuilds.build_environment(), "ASRPOOL_DEBIAN_MIRROR": "http://127.0.0.1:9"}
    done = subprocess.run([str(BUILD), "control"], capture_output=True, text=True,
                          timeout=600, check=False, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Release files" not in done.stderr
    (line,) = done.stdout.splitlines()
    assert line.split()[2] == images["control"].id


def test_an_unknown_image_is_one_line_naming_the_choices() -> None:
    done = subprocess.run([str(BUILD), "nginx"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "tools/images/build: unknown image or option 'nginx' (images: control server redis pause)"]


def test_a_failed_build_names_its_step_and_error(images: dict[str, Built],
                                                 tmp_path: Path) -> None:
    """A copy of the tool in a tree whose control Dockerfile fails at its last step (the
    base is already in podman's storage; logs go to a cache of the test's own)."""
    tool = tmp_path / "tools" / "images" / "build"
    tool.parent.mkdir(parents=True)
    shutil.copy2(BUILD, tool)
    (tmp_path / "charts" / "asrpool").mkdir(parents=True)
    shutil.copy2(ROOT / "charts" / "asrpool" / "Chart.yaml", tmp_path / "charts" / "asrpool")
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "control.Dockerfile").write_text(
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo no-such-package-here >&2 && false\n")
    env = {**os.environ, "ASRPOOL_CACHE": str(tmp_path / "cache")}
    before = working_containers()
    done = subprocess.run([str(tool), "control"], capture_output=True, text=True, timeout=600,
                          check=False, env=env)
    assert done.returncode != 0
    assert done.stdout == ""
    first, *rest = done.stderr.strip().splitlines()
    assert first.startswith("tools/images/build: control failed at STEP 2/2: RUN echo"), first
    assert "no-such-package-here" in "\n".join(rest)
    assert working_containers() - before == set()  # nor a mounted working container left


def working_containers() -> set[str]:
    done = subprocess.run(["buildah", "containers", "--quiet"], capture_output=True, text=True,
                          timeout=60, check=True)
    return set(done.stdout.split())


def test_a_missing_tool_is_one_line_naming_its_debian_package(tmp_path: Path) -> None:
    """On a PATH with bash and coreutils only, the first tool it needs is missing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "cut", "getent", "id"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    done = subprocess.run([str(bin_dir / "bash"), str(BUILD), "control"], capture_output=True,
                          text=True, timeout=60, check=False, env={"PATH": str(bin_dir)})
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "tools/images/build: buildah is missing: apt-get install buildah"]
