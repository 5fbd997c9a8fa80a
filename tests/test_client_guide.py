"""The client guide's examples run as written (docs/clients.md, the blocks marked
``# tested``): each against a real pod, its address for ``URL``, from the repository's
root, and each prints what its client heard."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import servers

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "clients.md"
BLOCK = re.compile(r"```(python|bash)\n# tested\n(.*?)```", re.DOTALL)


def examples() -> list[tuple[str, str]]:
    return [(kind, code) for kind, code in BLOCK.findall(GUIDE.read_text())]


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerProcess]:
    with servers.ServerProcess(tmp_path_factory.mktemp("guide"), batch_size=2) as server:
        server.wait_ready()
        yield server


def test_the_guide_has_its_examples() -> None:
    assert [kind for kind, _ in examples()] == ["python", "python", "bash"]


@pytest.mark.parametrize("index", range(3))
def test_each_example_runs_as_written(pod: servers.ServerProcess, index: int) -> None:
    kind, code = examples()[index]
    if kind == "python":
        command = [sys.executable, "-c", f"URL = {json.dumps(pod.ws_url)}\n{code}"]
    else:
        command = ["bash", "-c", code]
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "URL": pod.ws_url},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), "the example printed nothing it heard"
    if kind == "bash":
        assert {m["type"] for m in json.loads(done.stdout)} >= {"Word"}
