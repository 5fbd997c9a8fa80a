"""``asrpool fetch-model`` as the init container runs it: a real subprocess, the real
``huggingface_hub`` client and cache, against a stand-in Hub on loopback
(``tests.support.hubs``: the real Hub cannot be reached from here) or a closed port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants
import huggingface_hub.errors
import pytest
import torch

from asrpool.common import weights
from asrpool.server import fetching, models
from tests.support import hubs

REPO = "kyutai/stt-tiny"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved random ``tiny`` model in Kyutai's repo layout, plus a README not needed."""
    path = tmp_path_factory.mktemp("repo") / "stt-tiny"
    preset = models.PRESETS["tiny"]
    models.save_checkpoint_dir(models.build_random("tiny"), path, preset.mimi_config,
                               preset.lm_kwargs)
    (path / "README.md").write_text("not a file the server needs\n")
    return path


def run(command: list[str], cache: Path, endpoint: str,
        **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(cache),
                   "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_ETAG_TIMEOUT": "5",
                   "HF_HUB_DOWNLOAD_TIMEOUT": "5", **env}
    environment.pop("HF_TOKEN", None)
    environment.pop("HF_HUB_OFFLINE", None)
    return subprocess.run([sys.executable, "-m", "asrpool.cli", *command], env=environment,
                          capture_output=True, text=True, timeout=180, check=False)


def fetch(repo: str, cache: Path, endpoint: str, *extra: str,
          **env: str) -> subprocess.CompletedProcess[str]:
    return run(["fetch-model", repo, "--cache-dir", str(cache), *extra], cache, endpoint, **env)


def test_fetch_then_load_offline_and_a_second_fetch_downloads_nothing(
    checkpoint: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    with hubs.Hub({REPO: checkpoint}).running() as hub:
        first = fetch(REPO, cache, hub.url)
        assert first.returncode == 0, first.stderr
        assert sorted(hub.downloads) == sorted(f"{REPO}/{name}" for name in [
            "config.json", "model.safetensors", "mimi.safetensors", "tokenizer.model",
            "mimi_config.json"])  # what config.json names, not the README
        again = fetch(REPO, cache, hub.url)
        assert again.returncode == 0, again.stderr
        assert len(hub.downloads) == 5  # idempotent: the cache already holds every file
    # The server's own loader, offline, from that cache mounted read-only (as the pod's
    # server container, with HF_HUB_OFFLINE=1 and HF_HUB_CACHE): the weights that were saved.
    loaded = tmp_path / "loaded.pt"
    load = (f"import torch; from asrpool.server import models; "
            f"torch.save(models.load_model({REPO!r}).lm.state_dict(), {str(loaded)!r})")
    result = read_only(cache, [sys.executable, "-c", load],
                       {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)})
    assert result.returncode == 0, result.stderr
    saved = models.load_model(str(checkpoint))
    for (name, ours), (_, theirs) in zip(torch.load(loaded).items(),
                                         saved.lm.state_dict().items(), strict=True):
        assert torch.equal(ours, theirs), name


def read_only(folder: Path, command: list[str],
              env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` with ``folder`` bound read-only over itself, in a mount namespace of its
    own (root here, so permissions alone would not stop a write)."""
    script = ('mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" '
              '&& ! touch "$0/probe" 2>/dev/null && exec "$@"')
    return subprocess.run(["unshare", "--mount", "sh", "-c", script, str(folder), *command],
                          env=env, capture_output=True, text=True, timeout=180, check=False)


def test_an_unreachable_hub_is_the_registry_exit_code() -> None:
    """What the Hub client raises when it cannot connect and the cache lacks the file
    (the subprocess run, with the client's 23 s of retries, is tests/cluster's)."""
    raised = huggingface_hub.errors.LocalEntryNotFoundError("cannot find the requested files")
    error = fetching.fetch_error(raised, REPO)
    assert error.code == weights.EXIT_REGISTRY_UNAVAILABLE
    assert str(error).startswith("cannot reach the Hugging Face Hub at ")
    assert fetching.fetch_error(PermissionError(13, "denied"), REPO).code == \
        weights.EXIT_CACHE_UNAVAILABLE


def test_an_unknown_repo_is_model_unavailable(checkpoint: Path, tmp_path: Path) -> None:
    with hubs.Hub({REPO: checkpoint}).running() as hub:
        result = fetch("kyutai/no-such-repo", tmp_path / "hub", hub.url)
    assert result.returncode == weights.EXIT_MODEL_UNAVAILABLE, result.stderr
    assert "no such repo" in result.stderr.strip().splitlines()[-1]


def test_a_repo_without_a_named_file_is_model_unavailable(checkpoint: Path,
                                                          tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in checkpoint.iterdir():
        if path.name != "mimi.safetensors":
            (broken / path.name).write_bytes(path.read_bytes())
    with hubs.Hub({REPO: broken}).running() as hub:
        result = fetch(REPO, tmp_path / "hub", hub.url)
    assert result.returncode == weights.EXIT_MODEL_UNAVAILABLE, result.stderr
    assert "mimi.safetensors" in result.stderr.strip().splitlines()[-1]


def test_the_token_file_is_read_and_never_printed(checkpoint: Path, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("hf_secretvalue123\n")
    with hubs.Hub({REPO: checkpoint}).running() as hub:
        result = fetch(REPO, tmp_path / "hub", hub.url, "--token-file", str(token))
    assert result.returncode == 0, result.stderr
    assert "hf_secretvalue123" not in result.stdout + result.stderr
    missing = fetch(REPO, tmp_path / "hub", "http://127.0.0.1:9", "--token-file",
                    str(tmp_path / "absent"))
    assert missing.returncode == 2 and "cannot read the token file" in missing.stderr


def test_a_reference_that_is_not_a_repo_id_is_refused(tmp_path: Path) -> None:
    result = fetch("tiny", tmp_path / "hub", "http://127.0.0.1:9")
    assert result.returncode == 2 and "not a Hugging Face repo id" in result.stderr
