"""Who may open a stream on a pod, from the request's head alone: the pod token or an
API key (HTTP 401 otherwise), and the pod's new streams per second (HTTP 429), asked
before anything of the stream exists."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from asrpool.common import auth, limits, protocol, rates
from asrpool.server import settings

_POD_TOKEN_HEADER = protocol.POD_TOKEN_HEADER.encode()  # as h11 gives header names: lowercase


class Gate:
    def __init__(self, config: settings.ServerSettings, keys: auth.KeyRing | None,
                 count_error: Callable[[protocol.ErrorCode], None]) -> None:
        self.pod_token = config.pod_token
        self.keys = keys
        self.count_error = count_error
        self.bucket = (rates.TokenBucket(config.new_streams_per_second, config.new_streams_burst)
                       if config.new_streams_per_second else None)

    def refusal(self, headers: Mapping[str, str], query: Mapping[str, str],
                browser_key: str | None = None) -> str | None:
        """Why a request is refused before the upgrade (HTTP 401), or None.

        A pod with a pod token admits only requests that carry it: the routers', which
        checked the client's API key already (a router never forwards the key), so no key
        is asked for. A pod without a token checks the API key itself, if it has keys
        (``browser_key``: one an OpenAI client sent as a browser's subprotocol, which only
        a key that allows browsers may be)."""
        token = auth.revealed(self.pod_token)
        if token is not None:
            sent = headers.get(protocol.POD_TOKEN_HEADER)
            return None if auth.same_secret(sent, token) else protocol.UNAUTHORIZED
        if self.keys is not None:
            plain = headers.get(protocol.API_KEY_HEADER) or query.get(protocol.API_KEY_QUERY)
            found = self.keys.find(plain) if plain is not None or browser_key is None else \
                self.keys.find_browsers(browser_key)
            return None if found is not None else protocol.UNAUTHORIZED
        return None

    def new_stream(self, address: str, headers: Sequence[tuple[bytes, bytes]]
                   ) -> rates.Throttled | None:
        """Why a new stream is refused from its request head (HTTP 429, by the gate of
        ``limits.uvicorn_options``): over the process's new streams per second, whoever
        asks (a pod's clients are its routers). A router's link (it carries the pod
        token) hears it at once, not after the hold: it retries nothing, and its client
        waits on it. A router's resumes are not counted: when a router dies, all its
        clients come back at once through the others, and each must find its stream."""
        bucket = self.bucket
        if bucket is None or (limits.resuming(headers) and self._from_a_router(headers)):
            return None
        if bucket.take():
            return None
        self.count_error(rates.TOO_MANY_STREAMS)
        throttled = rates.too_many_streams(bucket.rate, "on this pod", bucket.seconds_until())
        return dataclasses.replace(throttled, held=not self._from_a_router(headers))

    def _from_a_router(self, headers: Sequence[tuple[bytes, bytes]]) -> bool:
        token = auth.revealed(self.pod_token)
        if token is None:
            return False
        sent = [value for name, value in headers if name == _POD_TOKEN_HEADER]
        return len(sent) == 1 and auth.same_secret(sent[0].decode("latin-1"), token)
