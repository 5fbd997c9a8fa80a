"""The folders map under the asrpool namespace, editable and as a wheel, and the
standard library's operator module is never shadowed."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import operator, asrpool.operator, asrpool.server, asrpool.router, asrpool.common,"
    " asrpool.plan.cli;"
    "assert operator.__name__ == 'operator' and hasattr(operator, 'itemgetter');"
    "print(asrpool.operator.__file__)"
)


def _probe(cwd: Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def test_editable_install_imports_from_the_repo_folders(tmp_path: Path) -> None:
    assert _probe(tmp_path) == str(ROOT / "operator" / "__init__.py")


def test_stdlib_operator_wins_even_from_the_repo_root() -> None:
    out = subprocess.run([sys.executable, "-c", "import operator; print(operator.__file__)"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    assert "site-packages" not in out.stdout and not out.stdout.startswith(str(ROOT))


def test_wheel_installs_and_imports(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist"), str(ROOT)], check=True)
    (wheel,) = (tmp_path / "dist").glob("asrpool-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "asrpool/operator/__init__.py" in names
    assert "asrpool/plan/simulating.py" in names
    assert not any(name.startswith("operator/") for name in names)
    # The product alone: the developers' harness (experiments, the local control plane)
    # is a distribution of its own.
    assert "asrpool/bench/capacity.py" in names and "asrpool/bench/server.py" in names
    assert not any(name.startswith(("asrpool_harness/", "asrpool/localcluster/"))
                   for name in names)
    assert "asrpool/bench/soak.py" not in names and "asrpool/bench/parity.py" not in names
    # The GPU capacities `asrpool plan` sizes pods from, beside their bench.
    assert "asrpool/bench/results/capacity-stt-1b-en_fr-cuda.json" in names
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True)
    env = dict(os.environ, PYTHONPATH=str(target))
    assert _probe(tmp_path, env) == str(target / "asrpool" / "operator" / "__init__.py")
