"""The Dockerfiles, read as text (no docker engine here): bases, pins, user, entry point,
build context; and the slim control image really runs the router and the operator
without the model stack."""

from __future__ import annotations

import ast
import fnmatch
import functools
import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import tomllib
from packaging.requirements import Requirement

from asrpool.operator import settings as operator_settings
from tests.chart import rendering

DOCKER = rendering.ROOT / "docker"
IMAGES = ["server", "control"]
UID = 10001


def instructions(image: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    text = (DOCKER / f"{image}.Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def final_stage(image: str) -> list[tuple[str, str]]:
    steps = instructions(image)
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last:]


def args(steps: list[tuple[str, str]]) -> dict[str, str]:
    return dict(rest.split("=", 1) for word, rest in steps if word == "ARG" and "=" in rest)


@functools.cache
def pyproject() -> dict[str, Any]:
    return tomllib.loads((rendering.ROOT / "pyproject.toml").read_text())


def pins() -> dict[str, str]:
    found = {}
    for text in pyproject()["project"]["dependencies"]:
        requirement = Requirement(text)
        found[requirement.name.lower()] = str(requirement.specifier)
    return found


def requirements_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_requirements", DOCKER / "requirements.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stages(image: str) -> list[list[tuple[str, str]]]:
    """The instructions of each stage, from its FROM."""
    found: list[list[tuple[str, str]]] = []
    for step in instructions(image):
        if step[0] == "FROM":
            found.append([])
        if found:
            found[-1].append(step)
    return found


def test_the_server_image_builds_from_the_slim_base_with_torch_and_moshi_as_pinned() -> None:
    """No CUDA base image: torch's wheel brings its CUDA libraries (tests/images checks
    that only the driver's are left to the host)."""
    base = args(instructions("server"))["BASE_IMAGE"]
    assert base.startswith("python:3.11") and base.endswith("-slim-bookworm")
    resolving, *_, final = stages("server")
    assert final[0] == ("FROM", "${BASE_IMAGE}")
    versions = args(resolving)
    assert f"=={versions['TORCH_VERSION']}" == pins()["torch"]
    assert f"=={versions['MOSHI_VERSION']}" == pins()["moshi"]
    resolve = " ".join(" ".join(rest.split()) for word, rest in resolving if word == "RUN")
    assert '"torch==${TORCH_VERSION}" "moshi==${MOSHI_VERSION}" >> /requirements.txt' in resolve
    assert "--report /resolved.json" in resolve
    assert "requirements.py layers /resolved.json > /layers.txt" in resolve
    runs = [" ".join(rest.split()) for word, rest in final if word == "RUN"]
    wheelhouse = '${WHEELHOUSE:+--no-index --find-links "$WHEELHOUSE"}'
    for line, run in enumerate(runs[:3], start=1):
        layer = f"sed -n {line}p /opt/layers.txt | xargs -r pip install --no-deps {wheelhouse}"
        assert layer in run
    assert f"pip install {wheelhouse} --requirement /opt/requirements.txt" in runs[3]
    assert "pip install --no-deps /wheels/asrpool-*.whl" in runs[4]


def report(*pins: str) -> dict[str, Any]:
    """A pip install report (``pip install --dry-run --report``) of these name==version."""
    return {"version": "1", "install": [
        {"metadata": {"name": name, "version": version}}
        for name, version in (pin.split("==") for pin in pins)]}


def test_the_server_packages_are_split_into_layers_of_cuda_libraries_and_torch() -> None:
    layers = requirements_script().layers
    resolved = report("numpy==2.2.6", "nvidia-cublas-cu12==12.8.4.1", "torch==2.9.1",
                      "nvidia_nccl_cu12==2.27.5", "triton==3.5.1", "nvidia-cudnn-cu12==9.10.2.21",
                      "moshi==0.2.13", "nvidia-cufft-cu12==11.3.3.83")
    assert layers(resolved) == [
        "nvidia-cublas-cu12==12.8.4.1 nvidia-cudnn-cu12==9.10.2.21",
        "nvidia-cufft-cu12==11.3.3.83 nvidia-nccl-cu12==2.27.5",
        "torch==2.9.1 triton==3.5.1"]


def test_without_cuda_wheels_their_layers_are_empty_lines() -> None:
    """torch without CUDA wheels (another platform or index): the image's steps read an
    empty line and install nothing (xargs -r), the last installs it all."""
    assert requirements_script().layers(report("torch==2.9.1", "numpy==2.2.6")) == [
        "", "", "torch==2.9.1"]


@pytest.mark.parametrize("image", IMAGES)
def test_every_stage_builds_from_the_base_argument_and_pips_only_into_a_venv(image: str) -> None:
    """So the same Dockerfile builds FROM python:3.11-slim and FROM Debian's python3,
    which refuses a system-wide pip (PEP 668)."""
    for stage in stages(image):
        assert stage[0][1].split()[0] == "${BASE_IMAGE}", stage[0]
        runs = " && ".join(rest for word, rest in stage if word == "RUN")
        commands = [c.strip() for c in runs.split("&&")]
        assert not any(c.startswith(("python ", "pip3 ")) for c in commands), commands
        pips = [i for i, c in enumerate(commands) if c.split()[0].endswith("pip")]
        venvs = [i for i, c in enumerate(commands) if c.startswith("python3 -m venv")]
        assert not pips or (venvs and venvs[0] < pips[0]), commands


def test_the_server_image_keeps_models_on_a_volume() -> None:
    stage = final_stage("server")
    env = " ".join(rest for word, rest in stage if word == "ENV")
    assert "HF_HOME=/models" in env
    assert ("VOLUME", '["/models"]') in stage
    runs = " ".join(rest for word, rest in stage if word == "RUN")
    assert f"chown {UID}:{UID} /models" in runs


@pytest.mark.parametrize("image", IMAGES)
def test_each_image_runs_asrpool_as_a_non_root_user(image: str) -> None:
    stage = final_stage(image)
    users = [rest for word, rest in stage if word == "USER"]
    assert users == [f"{UID}:{UID}"]
    assert f"useradd --uid {UID}" in " ".join(rest for word, rest in stage if word == "RUN")
    assert ("ENTRYPOINT", '["asrpool"]') in stage
    assert ("EXPOSE", str(operator_settings.SERVER_PORT)) in stage


def test_the_chart_runs_its_pods_as_the_images_user() -> None:
    for component in ("operator", "router"):
        pod = rendering.deployment(rendering.render(), component)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == UID


@pytest.mark.parametrize("image", IMAGES)
def test_each_image_builds_the_wheel_from_every_package_folder(image: str) -> None:
    copied = {source for word, rest in instructions(image)
              if word == "COPY" and not rest.startswith("--from") for source in rest.split()[:-1]}
    folders = set(pyproject()["tool"]["setuptools"]["package-dir"].values())
    assert folders | {"pyproject.toml", pyproject()["project"]["readme"]} <= copied
    for source in copied:
        assert (rendering.ROOT / source).exists(), source
        assert not ignored(source), f"{source} is in .dockerignore"


def ignored(path: str) -> bool:
    """As docker reads .dockerignore: the last pattern that matches the path (or a folder
    above it) decides, and a ``!`` pattern takes a path back in."""
    patterns = [line.strip() for line in (rendering.ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    out = False
    for pattern in patterns:
        kept = pattern.startswith("!")
        if any(fnmatch.fnmatch(prefix, pattern.removeprefix("!")) for prefix in prefixes):
            out = not kept
    return out


def test_the_build_context_leaves_out_environments_and_caches() -> None:
    for path in (".venv", ".git", "build", "tests", "bench/results", "router/__pycache__"):
        assert ignored(path), path


def test_the_control_image_installs_every_pin_but_the_model_stack() -> None:
    script = requirements_script()
    control = script.requirements("control", rendering.ROOT / "pyproject.toml")
    assert {script.distribution(pin) for pin in control} == set(pins()) - set(script.MODEL_STACK)
    assert set(script.requirements("server", rendering.ROOT / "pyproject.toml")) == set(
        pyproject()["project"]["dependencies"])
    runs = " ".join(rest for word, rest in final_stage("control") if word == "RUN")
    assert "pip install --requirement /opt/requirements.txt" in runs
    assert "pip install --no-deps /wheels/asrpool-*.whl" in runs


BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not in the control image")
sys.meta_path.insert(0, Block())
from asrpool import cli
parser = cli.build_parser()
for argv in (["route"], ["operator", "-A"]):
    assert parser.parse_args(argv).handler
import asrpool.router.serving, asrpool.router.app, asrpool.operator.running
import asrpool.operator.handlers
from asrpool.router import serving, settings
serving.uvicorn_config(settings.RouterSettings())
print("ok")
"""


def test_the_router_and_operator_run_without_the_model_stack() -> None:
    blocked = ",".join(requirements_script().MODEL_STACK.values())
    done = subprocess.run([sys.executable, "-c", BLOCKER, blocked], capture_output=True,
                          text=True, timeout=60, cwd=rendering.ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_everything_the_control_code_imports_is_installed_by_its_requirements() -> None:
    """Third-party imports of router/, operator/ and asrpool/ (but the client) resolve to
    distributions in the closure of the control image's requirements."""
    script = requirements_script()
    closure = dependency_closure(script.requirements("control", rendering.ROOT / "pyproject.toml"))
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for module in third_party_imports():
        distributions = {d.lower().replace("_", "-") for d in providers.get(module, [])}
        if not distributions & closure:
            missing[module] = sorted(distributions)
    assert missing == {}


def third_party_imports() -> set[str]:
    """Top-level names imported by router/, operator/, asrpool/cli.py and the shared
    asrpool.common modules those import."""
    root = rendering.ROOT
    sources = [*(root / "router").glob("*.py"), *(root / "operator").glob("*.py"),
               root / "asrpool" / "cli.py"]
    common = {name for path in sources for name in imported(path, "asrpool.common")}
    sources += [rendering.ROOT / "asrpool" / "common" / f"{name}.py" for name in common]
    found = {name.split(".")[0] for path in sources for name in imported(path)}
    return found - set(sys.stdlib_module_names) - {"asrpool", "__future__"}


def imported(path: Path, package: str = "") -> set[str]:
    """Modules imported anywhere in a file; with ``package``, the names imported from it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and not package:
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not package:
                found.add(node.module)
            elif node.module == package:
                found |= {alias.name for alias in node.names}
    return found


def dependency_closure(requirements: list[str]) -> set[str]:
    """Distribution names installed by these requirements, transitively (markers honoured)."""
    seen: set[str] = set()
    todo = [(Requirement(text), frozenset(Requirement(text).extras)) for text in requirements]
    while todo:
        requirement, extras = todo.pop()
        name = requirement.name.lower().replace("_", "-")
        key = name + json.dumps(sorted(extras))
        if key in seen:
            continue
        seen.add(key)
        seen.add(name)
        for text in importlib.metadata.requires(requirement.name) or []:
            child = Requirement(text)
            environments = [{"extra": extra} for extra in extras] or [{"extra": ""}]
            if child.marker is None or any(child.marker.evaluate(e) for e in environments):
                todo.append((child, frozenset(child.extras)))
    return {name for name in seen if "[" not in name}


def test_the_build_context_the_dockerfiles_copy_builds_the_wheel(tmp_path: Path) -> None:
    """The wheel stage, without docker: the files COPY takes (less .dockerignore) make a
    wheel holding every package and the router's static files."""
    context = tmp_path / "context"
    sources = {source for word, rest in instructions("control")
               if word == "COPY" and not rest.startswith("--from") for source in rest.split()[:-1]}
    for source in sources:
        copy_tree(rendering.ROOT / source, context / source)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
         "--wheel-dir", str(tmp_path / "wheels"), str(context)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "wheels").glob("asrpool-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for package in pyproject()["tool"]["setuptools"]["packages"]:
        assert f"{package.replace('.', '/')}/__init__.py" in names, package
    assert any(name.startswith("asrpool/router/static/") for name in names)
    assert "asrpool/bench/results/capacity-stt-1b-en_fr-cuda.json" in names  # asrpool plan's
    assert "asrpool/crds/streamingasrpools.asrpool.io.yaml" in names  # the operator's defaults
    assert not any(name.startswith("asrpool/crds/examples/") for name in names)


def _taken_back_below(folder: str) -> bool:
    """Whether a ``!`` pattern takes back something inside an ignored folder."""
    lines = (rendering.ROOT / ".dockerignore").read_text().splitlines()
    return any(line.startswith(f"!{folder}/") for line in lines)


def copy_tree(source: Path, target: Path) -> None:
    """Copy what docker's build context would hold (.dockerignore applied)."""
    relative = source.relative_to(rendering.ROOT).as_posix()
    if ignored(relative) and not (source.is_dir() and _taken_back_below(relative)):
        return
    if source.is_dir():
        for child in source.iterdir():
            copy_tree(child, target / child.name)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
