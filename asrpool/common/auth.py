"""API keys, stored hashed: the file format that server pods and routers both read.

The file (or the Kubernetes Secret mounted as a file) is YAML or JSON::

    keys:
      - id: team-a                 # shown in metrics and logs, never the key itself
        sha256: 5e884898da28...    # hex SHA-256 of the key
        max_streams: 8             # optional limit of concurrent streams (router)
        pools: [speech/stt-en, research/*]   # optional: the pools it may use (router)
        browsers: true             # optional: may come as OpenAI's browser subprotocol

A key with ``pools`` may use those pools alone (registry names, ``namespace/name``, or
``namespace/*`` for every pool of a namespace; a bare name where the router has no pool
namespace); any other pool is refused before the upgrade with HTTP 403 naming the pools
it may use, and nothing is written to Redis (no demand for a pool it may not use).

Clients send the plain key in the ``kyutai-api-key`` header or the ``auth_id`` query
parameter, as Kyutai's clients do; OpenAI's Realtime clients in ``Authorization: Bearer``,
or, from a browser (which cannot set headers), as the websocket subprotocol
``openai-insecure-api-key.KEY``, which only a key with ``browsers: true`` may (a key a
web page holds is a key its visitors can read).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    import pydantic

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_POOL = re.compile(r"[a-z0-9][-a-z0-9]*/(\*|[a-z0-9][-a-z0-9.]*)|[a-z0-9][-a-z0-9.]*")


class KeyFileError(ValueError):
    """The key file is missing or malformed; the message says where."""


@dataclasses.dataclass(frozen=True)
class ApiKey:
    id: str
    sha256: str
    max_streams: int | None = None
    pools: tuple[str, ...] | None = None  # None: every pool
    browsers: bool = False  # may come as OpenAI's browser subprotocol

    def allows(self, pool: str) -> bool:
        """Whether this key may use ``pool`` (a registry name)."""
        if self.pools is None:
            return True
        return any(pool == allowed or (allowed.endswith("/*") and
                                       pool.startswith(allowed[:-1]))
                   for allowed in self.pools)

    def refusal(self, pool: str) -> str:
        allowed = ", ".join(self.pools or ())
        return f"API key {self.id} may not use pool {pool} (it may use: {allowed})"


def hash_key(plain: str) -> str:
    return hashlib.sha256(plain.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class KeyRing:
    keys: tuple[ApiKey, ...]

    def find(self, plain: str | None) -> ApiKey | None:
        """The key entry matching ``plain``, compared in constant time, or None."""
        if not plain:
            return None
        digest = hash_key(plain)
        match = None
        for key in self.keys:
            if hmac.compare_digest(key.sha256, digest):
                match = key
        return match

    def find_browsers(self, plain: str | None) -> ApiKey | None:
        """The key entry for a key sent as OpenAI's browser subprotocol: only one that
        allows browsers."""
        key = self.find(plain)
        return key if key is not None and key.browsers else None


def revealed(secret: pydantic.SecretStr | None) -> str | None:
    """A secret setting's text, or None when it is unset or empty (no secret then)."""
    return (secret.get_secret_value() or None) if secret is not None else None


def same_secret(given: str | None, expected: str) -> bool:
    """``given == expected`` in constant time (any text: compared as UTF-8 bytes)."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


# ``auth_id`` (the live page's key) and ``asrpool-resume-token`` (its stream's), in the
# query, as uvicorn logs paths, encoded or not.
_SECRET_QUERY = re.compile(
    r"((?:^|[?&])(?:auth(?:_|%5f)id|asrpool(?:-|%2d)resume(?:-|%2d)token)=)[^&\s\"']*",
    re.IGNORECASE)


def redact(text: str) -> str:
    return _SECRET_QUERY.sub(r"\1<redacted>", text)


class RedactSecrets(logging.Filter):
    """Rewrites a record whose message carries an API key or a resume token in a query
    string."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def redact_server_logs() -> None:
    """Keep API keys and resume tokens out of uvicorn's access and websocket lines (call
    after uvicorn has configured its logging, i.e. after building its ``Config``)."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())


def load_keys(path: str | Path) -> KeyRing:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise KeyFileError(f"cannot read API key file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise KeyFileError(f"API key file {path} is not valid YAML/JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise KeyFileError(f"API key file {path} must be a map with a 'keys' list")
    return KeyRing(tuple(_parse_key(entry, path, i) for i, entry in enumerate(data["keys"])))


def _parse_key(entry: object, path: str | Path, index: int) -> ApiKey:
    where = f"{path}: keys[{index}]"
    if not isinstance(entry, dict):
        raise KeyFileError(f"{where} must be a map with 'id' and 'sha256'")
    key_id, digest, limit = entry.get("id"), entry.get("sha256"), entry.get("max_streams")
    if not isinstance(key_id, str) or not key_id:
        raise KeyFileError(f"{where}: 'id' must be a non-empty string")
    if not isinstance(digest, str) or not _HEX64.match(digest.lower()):
        raise KeyFileError(f"{where}: 'sha256' must be 64 hex digits (the key's SHA-256)")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise KeyFileError(f"{where}: 'max_streams' must be a positive integer")
    browsers = entry.get("browsers", False)
    if not isinstance(browsers, bool):
        raise KeyFileError(f"{where}: 'browsers' must be true or false")
    return ApiKey(id=key_id, sha256=digest.lower(), max_streams=limit,
                  pools=_pools(entry.get("pools"), where), browsers=browsers)


def _pools(value: object, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or not value
            or not all(isinstance(pool, str) and _POOL.fullmatch(pool) for pool in value)):
        raise KeyFileError(f"{where}: 'pools' must be a non-empty list of pool names "
                           "(namespace/name, namespace/* or name)")
    return tuple(value)
