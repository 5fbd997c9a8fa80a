"""What pods and routers both say in OpenAI's Realtime API (transcription mode): its
path, the query and headers that choose it, and its ``error`` event, which every part
that refuses or ends such a session sends as JSON text (Kyutai's clients get a msgpack
``Error`` instead). The session's protocol itself is the pod's
(:mod:`asrpool.server.realtime`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

PATH = "/v1/realtime"
INTENT = "transcription"  # ?intent=transcription: the only mode asrpool serves
BETA_HEADER = "openai-beta"  # OpenAI-Beta: realtime=v1, the beta SDK's
SUBPROTOCOL = "realtime"  # answered where a client offers it (browsers do)
BROWSER_KEY = "openai-insecure-api-key."  # a browser's key, as a subprotocol: PREFIX + KEY
SERVER_ERROR = "server_error"
Event = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:22]}"


def event(kind: str, **fields: Any) -> Event:
    """A server event: every one has its own ``event_id``."""
    return {"type": kind, "event_id": new_id("event"), **fields}


def error(code: str, message: str, param: str | None = None,
          client_event_id: str | None = None, kind: str = "invalid_request_error") -> Event:
    return event("error", error={"type": kind, "code": code, "message": message,
                                 "param": param, "event_id": client_event_id})


def text(item: Event) -> str:
    """An event as a text message: compact JSON, its fields in their order (routers read
    a turn's usage from the first bytes of its event, router.dialects.turn_seconds)."""
    return json.dumps(item, separators=(",", ":"))


def encode(item: Event) -> bytes:
    return text(item).encode()


def subprotocol(offered: str) -> str | None:
    """The subprotocol to answer for a ``Sec-WebSocket-Protocol`` request header."""
    return SUBPROTOCOL if SUBPROTOCOL in _offered(offered) else None


def bearer_key(headers: Any) -> str | None:
    """The key of ``Authorization: Bearer KEY`` (OpenAI's clients send theirs so), if any."""
    scheme, _, token = str(headers.get("authorization", "")).partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def browser_key(offered: str) -> str | None:
    """The API key a browser sent as a subprotocol, if it did."""
    return next((p.removeprefix(BROWSER_KEY) for p in _offered(offered)
                 if p.startswith(BROWSER_KEY)), None)


def _offered(header: str) -> list[str]:
    return [p.strip() for p in header.split(",")]
