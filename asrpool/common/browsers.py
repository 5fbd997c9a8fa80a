"""What a web page elsewhere may not make a visitor's browser do to a pod or a router.

A browser lets any page open a websocket to any address, and send a "simple" POST (a
form's content types, no preflight) to it: a page that a user inside the network
visits could stream to an internal router, or have a file transcribed, as that user.
Browsers name the page's origin in an ``Origin`` header on both (other clients send
none), so pods and routers refuse, from the request head:

- a websocket upgrade or a POST whose ``Origin`` is neither the server's own (the same
  host and port as the request's ``Host``: the router's live page; on a server that
  asks no API key, only by an IP address or ``localhost``, since a DNS name can be
  rebound to the server) nor one of ``--allowed-origins`` (comma-separated; ``*`` any),
  with HTTP 403;
- a POST whose content type is not an audio file's (``--upload-content-types``:
  ``audio/*``, ``application/ogg``, ``application/octet-stream`` by default), with 415:
  the form types a page can send without asking (``text/plain``, ``multipart/form-data``,
  ``application/x-www-form-urlencoded``, also curl's default for ``--data-binary``) never
  carry audio here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib import parse

ANY = "*"
DEFAULT_UPLOAD_TYPES = "audio/*,application/ogg,application/octet-stream"
ORIGINS_FLAG = "--allowed-origins (ASRPOOL_ALLOWED_ORIGINS)"
TYPES_FLAG = "--upload-content-types (ASRPOOL_UPLOAD_CONTENT_TYPES)"

Headers = Sequence[tuple[bytes, bytes]]  # as h11 gives them: names in lower case


def entries(text: str) -> tuple[str, ...]:
    """A comma-separated setting's entries, trimmed, in lower case."""
    return tuple(part.strip().lower() for part in text.split(",") if part.strip())


def origins(text: str) -> tuple[str, ...]:
    """``--allowed-origins`` as browsers spell an origin (no trailing slash)."""
    return tuple(origin.rstrip("/") for origin in entries(text))


def origin_problem(headers: Headers, allowed: Sequence[str], keyless: bool = False) -> str | None:
    """Why a request with these headers may not come from its page, or None
    (``allowed``: :func:`origins`). ``keyless``: the server asks no key, so a page that
    had a DNS name of its own rebound to this server's address (its Origin then matches
    the Host its visitors' browsers send) would use it as them: the server's own origin
    then counts by an IP address or ``localhost`` only, a DNS name only when allowed."""
    origin = _header(headers, b"origin")
    if origin is None or ANY in allowed or origin.lower() in allowed:
        return None
    host = _header(headers, b"host")
    if host is not None and parse.urlsplit(origin).netloc.lower() == host.lower():
        if not keyless or _not_rebindable(host):
            return None
        return (f"origin {origin!r} names this server by a DNS name, and it asks no API key:"
                " a page whose name was rebound to this address would reach it through its"
                f" visitors' browsers; list the origin in {ORIGINS_FLAG}")
    return (f"origin {origin!r} may not use this server: a page there would reach it"
            f" through its visitors' browsers; allow it with {ORIGINS_FLAG}")


def _not_rebindable(host: str) -> bool:
    """An IP address or localhost: no page elsewhere can take that name."""
    name = parse.urlsplit("//" + host).hostname or ""
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def content_type_problem(headers: Headers, allowed: Sequence[str]) -> str | None:
    """Why a POST with these headers is no audio file, or None."""
    given = _header(headers, b"content-type")
    media = (given or "").split(";")[0].strip().lower()
    if media and any(_matches(media, pattern) for pattern in allowed):
        return None
    what = f"content type {given!r}" if given else "no content type"
    return (f"{what}: send the file as audio (Content-Type: audio/wav, audio/ogg, ... or"
            f" application/octet-stream; curl: -H 'Content-Type: audio/wav'), or allow the"
            f" type with {TYPES_FLAG}")


def _matches(media: str, pattern: str) -> bool:
    if pattern.endswith("/*"):
        return media.startswith(pattern[:-1])
    return media == pattern


def _header(headers: Headers, name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None
