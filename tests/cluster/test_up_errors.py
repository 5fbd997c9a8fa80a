"""tools/cluster/build and tools/cluster/up fail with one clear line, never a hang."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.processes import running_with

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools" / "cluster"


def test_build_without_go_says_so(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ASRPOOL_CACHE": str(tmp_path)}
    result = subprocess.run([str(TOOLS / "build")], env=env, capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "tools/cluster/build: no Go toolchain on PATH: install Go (1.25 or newer) to build "
        "the Kubernetes control plane"]


def up(bin_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asrpool_harness.localcluster", "--kubeconfig", str(tmp_path / "kc"),
         "--bin-dir", str(bin_dir), "--workdir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=120, check=False, start_new_session=True)


def test_up_without_binaries_says_to_build_them(tmp_path: Path) -> None:
    result = up(tmp_path / "nothing", tmp_path)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert "kube-apiserver" in line and "run tools/cluster/build first" in line


def test_a_binary_that_dies_at_start_is_named_with_its_last_words(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"):
        script = bin_dir / name
        script.write_text("#!/bin/sh\necho 'failed to listen on 127.0.0.1: address already in "
                          "use' >&2\nexit 1\n")
        script.chmod(0o755)
    result = up(bin_dir, tmp_path)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("tools/cluster/up: kube-apiserver exited (1): failed to listen on "
                           "127.0.0.1: address already in use")
    assert running_with(str(tmp_path)) == []  # etcd, started first, was stopped too

