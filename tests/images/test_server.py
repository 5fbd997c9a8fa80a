"""The server image: torch on the CPU, a transcription as uid 10001 with a read-only
root and the model cache on a volume, and CUDA libraries that need only the driver."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from asrpool.common import processes
from tests.images import containers
from tests.images.conftest import ROOT, Built

UID = 10001
SAMPLE = ROOT / "samples" / "hello.wav"


@pytest.fixture
def server(images: dict[str, Built]) -> str:
    return images["server"].name


@pytest.fixture
def models() -> Iterator[str]:
    with containers.volume("models") as name:
        yield name


def test_torch_imports_and_computes_on_the_cpu(server: str) -> None:
    code = ("import torch; x = torch.arange(6.0).reshape(2, 3); "
            "print(torch.__version__, torch.cuda.is_available(), float((x @ x.T).sum()))")
    done = containers.run(server, ["-c", code], entrypoint="python")
    assert done.returncode == 0, done.stderr[-2000:]
    version, cuda, total = done.stdout.split()
    # torch's CUDA build (2.9.1+cu128), running on a CPU.
    assert version.startswith("2.9.1+cu") and cuda == "False"
    assert float(total) == 83.0


def test_no_layer_of_the_server_image_is_over_three_gigabytes(server: str) -> None:
    """Committing a layer takes twice its size in temporary disk (buildah's copy and
    containers/image's), so the 7.8 GB of packages are in four layers, not one."""
    done = containers.podman("history", "--format", "json", server, timeout=60)
    assert done.returncode == 0, done.stderr
    sizes = [layer["size"] for layer in json.loads(done.stdout)]
    assert sum(sizes) > 6e9
    assert max(sizes) < 3e9, sorted(sizes)[-4:]


def test_it_transcribes_a_file_as_uid_10001_on_a_read_only_root(server: str, models: str) -> None:
    options = ["--volume", f"{SAMPLE}:/audio/hello.wav:ro", "--volume", f"{models}:/models"]
    done = containers.run(server, ["transcribe", "/audio/hello.wav", "--model", "tiny",
                                   "--json"], options)
    assert done.returncode == 0, done.stderr[-3000:]
    messages = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    words = [m["text"] for m in messages if m["type"] == "Word"]
    assert words and all(isinstance(w, str) and w for w in words)


def test_the_model_cache_volume_is_writable_by_the_server_user(server: str, models: str) -> None:
    done = containers.run(
        server, ["-c", 'id -u; echo "$HF_HOME"; touch "$HF_HOME/probe" && stat -c %u /models; '
                 "touch /written 2>/dev/null || echo root-read-only"],
        ["--volume", f"{models}:/models"], entrypoint="sh")
    assert done.stdout.split() == [str(UID), "/models", str(UID), "root-read-only"], done.stderr


# Plugins of NVSHMEM and cuFile for multi-node transports (InfiniBand verbs, MPI, UCX,
# libfabric, PMIx), opened only when such a transport is configured: their libraries
# come with those fabrics, not with CUDA.
FABRIC_PLUGINS = ("nvshmem_bootstrap_", "nvshmem_transport_", "libcufile_rdma")

def post_audio(url: str) -> list[dict[str, object]]:
    request = urllib.request.Request(url, data=SAMPLE.read_bytes(), method="POST",
                                     headers={"Content-Type": "audio/wav"})
    with urllib.request.urlopen(request, timeout=120) as response:
        messages: list[dict[str, object]] = json.loads(response.read())
    return messages


def test_it_serves_a_posted_file_and_stops_cleanly_on_sigterm(server: str, models: str) -> None:
    """`asrpool serve` as the image's PID 1 on the host's network, bound to 127.0.0.1,
    with the writable folders the operator mounts (operator/children.py: /tmp, where a
    POSTed file is decoded, and /models): ready, a POSTed file gets its words, and
    SIGTERM (podman stop) ends it with 0."""
    port = processes.free_port()
    command = ["serve", "--model", "tiny", "--batch-size", "2", "--host", "127.0.0.1",
               "--port", str(port)]
    options = ["--network", "host", "--volume", f"{models}:/models",
               "--tmpfs", "/tmp:rw,size=64m,mode=1777"]
    with containers.started(server, command, options) as name:
        url = f"http://127.0.0.1:{port}"
        containers.wait_for_http(name, f"{url}/readyz")
        messages = post_audio(f"{url}/api/asr-streaming")
        assert any(m["type"] == "Word" and m["text"] for m in messages), messages[:5]
        stopped = containers.podman("stop", "--time", "30", name, timeout=90)
        assert stopped.returncode == 0, stopped.stderr
        code = containers.podman("inspect", "--format", "{{.State.ExitCode}}", name)
        assert code.stdout.strip() == "0", containers.logs(name)


UNRESOLVED = r"""
set -eu
site=$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
find "$site/torch/lib" "$site/nvidia" -name '*.so*' -type f | while read -r lib; do
  ldd "$lib" 2>/dev/null | awk -v lib="${lib##*/}" '/not found/ {print lib, $1}'
done | sort -u
"""


def test_cuda_libraries_need_nothing_from_the_host_but_the_driver(server: str) -> None:
    """Every shared library of torch and its nvidia-* wheels resolves inside the image
    (ldd), except the driver's libcuda.so.1: why no CUDA base image is needed."""
    done = containers.run(server, ["-c", UNRESOLVED], entrypoint="sh")
    assert done.returncode == 0, done.stderr[-2000:]
    pairs = [line.split() for line in done.stdout.splitlines()]
    missing = {needed for lib, needed in pairs if not lib.startswith(FABRIC_PLUGINS)}
    assert missing == {"libcuda.so.1"}, pairs
