"""Session ids and the router's resume tokens.

A resume token is ``{pool}.{session_id}.{secret}``; Redis keeps only its SHA-256, so
reading the registry does not let anyone resume someone else's stream. The pool is in
the token because the session's record is a key of its pool (``asrpool:{POOL}:session:
{sid}``, one Redis Cluster slot per pool) and a resume names no pool otherwise. Pool
names are DNS names and may hold dots, so a token is read from the right.

Tokens of routers before the pool was in them (``{session_id}.{secret}``) are refused
with :func:`refusals.old_resume_token`'s words (:func:`is_old`), once, on upgrade.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import secrets
import uuid

from asrpool.router import poolnames

_SID = re.compile(r"[0-9a-f]{32}")
_SECRET = re.compile(r"[A-Za-z0-9_-]{32,64}")


@dataclasses.dataclass(frozen=True)
class ResumeToken:
    pool: str
    session_id: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def new_session_id() -> str:
    return uuid.uuid4().hex


def mint(pool: str, session_id: str) -> ResumeToken:
    return ResumeToken(pool, session_id, f"{pool}.{session_id}.{secrets.token_urlsafe(32)}")


def parse(text: str) -> ResumeToken | None:
    """The token, or None when ``text`` cannot be one of ours."""
    head, dot, secret = text.rpartition(".")
    pool, dot_, sid = head.rpartition(".")
    if not (dot and dot_) or poolnames.resolve(pool, None) != pool or not _shaped(sid, secret):
        return None
    return ResumeToken(pool, sid, text)


def is_old(text: str) -> bool:
    """Whether ``text`` is a token of a router from before tokens named their pool."""
    sid, dot, secret = text.partition(".")
    return bool(dot) and _shaped(sid, secret)


def _shaped(sid: str, secret: str) -> bool:
    return bool(_SID.fullmatch(sid) and _SECRET.fullmatch(secret))
