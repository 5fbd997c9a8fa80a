"""Session ids and the router's resume tokens.

A resume token is ``{session_id}.{secret}``; Redis keeps only its SHA-256, so reading
the registry does not let anyone resume someone else's stream.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import secrets
import uuid

_SID = re.compile(r"[0-9a-f]{32}")
_SECRET = re.compile(r"[A-Za-z0-9_-]{32,64}")


@dataclasses.dataclass(frozen=True)
class ResumeToken:
    session_id: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def new_session_id() -> str:
    return uuid.uuid4().hex


def mint(session_id: str) -> ResumeToken:
    return ResumeToken(session_id, f"{session_id}.{secrets.token_urlsafe(32)}")


def parse(text: str) -> ResumeToken | None:
    """The token, or None when ``text`` cannot be one of ours."""
    sid, dot, secret = text.partition(".")
    if not dot or not _SID.fullmatch(sid) or not _SECRET.fullmatch(secret):
        return None
    return ResumeToken(sid, text)
