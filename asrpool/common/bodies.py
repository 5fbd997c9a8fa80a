"""Request bodies read up to a limit (``POST /api/asr-streaming`` on pods and routers).

A body is read chunk by chunk and given up as soon as it passes the limit, so that a
client cannot make a pod or router hold more than the limit in memory.
"""

from __future__ import annotations

from starlette import requests


class TooLarge(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"body of {size}+ bytes exceeds the limit of {limit} bytes")


async def read_limited(request: requests.Request, limit: int) -> bytes:
    """The whole body; raises :class:`TooLarge` once it passes ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(int(declared), limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise TooLarge(len(body), limit)
    return bytes(body)
