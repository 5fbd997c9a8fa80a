"""A pod's own key check (server.gate) for OpenAI's browser clients: a key sent as the
``openai-insecure-api-key.KEY`` subprotocol opens a stream only where the key allows
browsers; the same key in a header works either way."""

from __future__ import annotations

from asrpool.common import auth, protocol
from asrpool.server import gate, settings

PAGE, SERVER = "k-page", "k-server"
RING = auth.KeyRing((auth.ApiKey("page", auth.hash_key(PAGE), browsers=True),
                     auth.ApiKey("server", auth.hash_key(SERVER))))


def test_a_browser_key_opens_a_stream_only_where_the_key_allows_browsers() -> None:
    pod = gate.Gate(settings.ServerSettings(), RING, lambda code: None)
    assert pod.refusal({}, {}, browser_key=PAGE) is None
    assert pod.refusal({}, {}, browser_key=SERVER) == protocol.UNAUTHORIZED
    assert pod.refusal({protocol.API_KEY_HEADER: SERVER}, {}) is None
    assert pod.refusal({}, {}) == protocol.UNAUTHORIZED
