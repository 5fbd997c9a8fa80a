"""``asrpool fetch-model``: put a Hugging Face checkpoint into a cache before the server starts.

The operator runs it as the server pod's init container, into the pool's cache (an
emptyDir, a node's hostPath or a shared PVC); the server then loads from that cache
with ``HF_HUB_OFFLINE=1``. ``huggingface_hub`` keeps the cache safe for concurrent
writers (file locks) and skips what it already holds, so a second run downloads
nothing. The token comes from ``--token-file`` or ``HF_TOKEN`` (the pod sets it from
a Secret); it is never printed. The exit code says why it failed
(:mod:`asrpool.common.weights`), and the last line on stderr says what failed: the
operator shows that line in the pool's status.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from asrpool.common import weights


class FetchError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "fetch-model", help="download a Hugging Face checkpoint into a cache (init container)",
        description="Download what a Kyutai STT checkpoint needs (config.json and the files"
                    " it names) into a Hugging Face cache. Idempotent. Exit codes: 0 done,"
                    f" {weights.EXIT_MODEL_UNAVAILABLE} no such repo/revision/file or token"
                    f" refused, {weights.EXIT_REGISTRY_UNAVAILABLE} the Hub cannot be reached,"
                    f" {weights.EXIT_CACHE_UNAVAILABLE} the cache cannot be written.")
    parser.add_argument("repo", help="Hugging Face repo id (org/name)")
    parser.add_argument("--revision", default=None, help="branch, tag or commit (default main)")
    parser.add_argument("--cache-dir", default=None,
                        help="Hugging Face cache folder (default: HF_HUB_CACHE or ~/.cache)")
    parser.add_argument("--token-file", default=None,
                        help="file holding the Hub token (default: HF_TOKEN, if set)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        if weights.kind_of(args.repo) is not weights.Kind.REPO:
            raise FetchError(2, f"{args.repo!r} is not a Hugging Face repo id (org/name)")
        token = _read_token(args.token_file)
        folder = fetch(args.repo, args.revision, args.cache_dir, token)
    except FetchError as exc:
        print(f"asrpool fetch-model: {exc}", file=sys.stderr)
        return exc.code
    print(f"asrpool fetch-model: {_where(args.repo, args.revision)} is in {folder}")
    return 0


def fetch(repo: str, revision: str | None, cache_dir: str | None, token: str | None) -> Path:
    """Download the checkpoint's files; the snapshot folder that holds them."""
    try:
        return _download(repo, revision, cache_dir, token)
    except FetchError:
        raise
    except Exception as exc:  # the Hub's errors come in many types: sort them by meaning
        raise fetch_error(exc, _where(repo, revision)) from exc


def _download(repo: str, revision: str | None, cache_dir: str | None,
              token: str | None) -> Path:
    import huggingface_hub

    options: dict[str, Any] = {"revision": revision, "cache_dir": cache_dir, "token": token}
    config = _read_config(huggingface_hub.hf_hub_download(repo, weights.CONFIG_NAME, **options))
    names = weights.checkpoint_files(config)
    own = [name for name in names if not name.startswith("hf://")]
    folder = Path(huggingface_hub.snapshot_download(
        repo, allow_patterns=[weights.CONFIG_NAME, *own], **options))
    for name in names:
        if name.startswith("hf://"):  # a file of another repo, as moshi's hf_get reads it
            org, other, path = name.removeprefix("hf://").split("/", 2)
            huggingface_hub.hf_hub_download(f"{org}/{other}", path, **options)
    missing = [name for name in own if not (folder / name).is_file()]
    if missing:
        raise FetchError(weights.EXIT_MODEL_UNAVAILABLE,
                         f"{_where(repo, revision)} has no {', '.join(missing)} (named in its"
                         f" {weights.CONFIG_NAME})")
    return folder


def _read_config(path: str) -> dict[str, Any]:
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FetchError(weights.EXIT_MODEL_UNAVAILABLE,
                         f"its {weights.CONFIG_NAME} cannot be read: {exc}") from exc
    if not isinstance(config, dict):
        raise FetchError(weights.EXIT_MODEL_UNAVAILABLE,
                         f"its {weights.CONFIG_NAME} is not a JSON object")
    return config


def fetch_error(exc: Exception, where: str) -> FetchError:
    """The exit code and message for what the Hub client raised."""
    from huggingface_hub import constants, errors

    hub = constants.ENDPOINT
    if isinstance(exc, errors.LocalEntryNotFoundError | errors.OfflineModeIsEnabled):
        return FetchError(weights.EXIT_REGISTRY_UNAVAILABLE,
                          f"cannot reach the Hugging Face Hub at {hub} to fetch {where}, and"
                          " the cache does not hold it")
    if isinstance(exc, errors.GatedRepoError):
        return FetchError(weights.EXIT_MODEL_UNAVAILABLE,
                          f"{where} is gated: the token is missing or has no access")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return FetchError(weights.EXIT_MODEL_UNAVAILABLE,
                          f"{where}: no such repo on {hub} (or it is private and the token"
                          " is missing or refused)")
    if isinstance(exc, errors.RevisionNotFoundError):
        return FetchError(weights.EXIT_MODEL_UNAVAILABLE, f"{where}: no such revision")
    if isinstance(exc, errors.EntryNotFoundError):
        return FetchError(weights.EXIT_MODEL_UNAVAILABLE, f"{where}: {_first_line(exc)}")
    if isinstance(exc, errors.HfHubHTTPError):
        return _http_error(exc, where, hub)
    if isinstance(exc, OSError) and not _is_network(exc):
        return FetchError(weights.EXIT_CACHE_UNAVAILABLE,
                          f"cannot write the cache for {where}: {exc}")
    return FetchError(weights.EXIT_REGISTRY_UNAVAILABLE,
                      f"cannot fetch {where} from {hub}: {_first_line(exc)}")


def _http_error(exc: Any, where: str, hub: str) -> FetchError:
    status = getattr(exc.response, "status_code", None)
    if status in (401, 403):
        return FetchError(weights.EXIT_MODEL_UNAVAILABLE,
                          f"{where}: the Hub refused the token (HTTP {status})")
    return FetchError(weights.EXIT_REGISTRY_UNAVAILABLE,
                      f"the Hugging Face Hub at {hub} failed fetching {where} (HTTP {status})")


def _is_network(exc: OSError) -> bool:
    import requests

    return isinstance(exc, requests.RequestException | TimeoutError | ConnectionError)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _read_token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise FetchError(2, f"cannot read the token file {path}: {exc.strerror}") from exc
    if not token:
        raise FetchError(2, f"the token file {path} is empty")
    return token


def _where(repo: str, revision: str | None) -> str:
    return f"{repo}@{revision}" if revision else repo
