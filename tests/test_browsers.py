"""A page elsewhere cannot have its visitors' browsers stream or POST to a pod or a
router (asrpool.common.browsers, checked from the request head by limits): a foreign
Origin is 403 and a POST that is no audio file 415, each naming the setting that
allows it; clients that send no Origin (every non-browser one) pass."""

from __future__ import annotations

from http import HTTPStatus

import h11
import pytest

from asrpool.common import limits
from asrpool.router import settings as router_settings
from asrpool.server import settings as server_settings

HOST = "asr.internal:8000"


def _request(method: str, **headers: str) -> h11.Request:
    base = {"host": HOST}
    if method == "GET":
        base |= {"upgrade": "websocket", "connection": "Upgrade"}
    return h11.Request(method=method, target="/api/asr-streaming",
                       headers=list({**base, **headers}.items()))


def _limits(**settings: str) -> limits.Limits:
    return server_settings.ServerSettings(**settings).connection_limits


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_foreign_origin_is_403_naming_the_setting(method: str) -> None:
    headers = {"origin": "https://evil.example", "content-type": "audio/wav"}
    problem = limits.request_problem(_request(method, **headers), _limits())
    assert problem is not None and problem[0] is HTTPStatus.FORBIDDEN
    assert "origin 'https://evil.example' may not use this server" in problem[1]
    assert "--allowed-origins (ASRPOOL_ALLOWED_ORIGINS)" in problem[1]


@pytest.mark.parametrize("origin", [None, f"http://{HOST}", f"https://{HOST.upper()}"])
def test_no_origin_or_the_servers_own_passes(origin: str | None) -> None:
    headers = {"origin": origin} if origin else {}
    keyed = _limits(api_keys_file="keys.json")
    assert limits.request_problem(_request("GET", **headers), keyed) is None


@pytest.mark.parametrize("keyless", [
    server_settings.ServerSettings(), router_settings.RouterSettings()])
def test_without_keys_the_servers_own_dns_name_is_refused_as_a_rebinding_could_use_it(
        keyless: limits.LimitSettings) -> None:
    """DNS rebinding: a page at evil.example whose name now resolves to this server sends
    Origin and Host alike; with no key asked, only a listed origin passes by name."""
    headers = {"origin": f"http://{HOST}"}
    problem = limits.request_problem(_request("GET", **headers), keyless.connection_limits)
    assert problem is not None and problem[0] is HTTPStatus.FORBIDDEN
    assert "DNS name" in problem[1] and "rebound" in problem[1]
    assert "--allowed-origins (ASRPOOL_ALLOWED_ORIGINS)" in problem[1]
    listed = keyless.model_copy(update={"allowed_origins": f"http://{HOST}"})
    assert limits.request_problem(_request("GET", **headers), listed.connection_limits) is None


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "[::1]:8000", "localhost:8000",
                                  "10.1.2.3"])
def test_without_keys_the_servers_own_address_or_localhost_passes(host: str) -> None:
    request = h11.Request(method="GET", target="/api/asr-streaming", headers=[
        ("host", host), ("upgrade", "websocket"), ("connection", "Upgrade"),
        ("origin", f"http://{host}")])
    assert limits.request_problem(request, _limits()) is None


@pytest.mark.parametrize(("allowed", "passes"), [
    ("https://app.example", True), ("https://other.example, https://app.example/", True),
    ("*", True), ("https://app.example:8443", False), ("", False)])
def test_allowed_origins_are_listed_exactly(allowed: str, passes: bool) -> None:
    for settings_class in (server_settings.ServerSettings, router_settings.RouterSettings):
        given = settings_class(allowed_origins=allowed).connection_limits
        problem = limits.request_problem(_request("GET", origin="https://app.example"), given)
        assert (problem is None) is passes


def test_a_null_origin_is_foreign() -> None:
    """Sandboxed frames and file:// pages say ``null``."""
    assert limits.request_problem(_request("GET", origin="null"), _limits()) is not None


@pytest.mark.parametrize("content_type", [
    "text/plain", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded",
    "application/json", None])
def test_a_post_that_is_no_audio_file_is_415(content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    problem = limits.request_problem(_request("POST", **headers), _limits())
    assert problem is not None and problem[0] is HTTPStatus.UNSUPPORTED_MEDIA_TYPE
    assert "Content-Type: audio/wav" in problem[1]
    assert "--upload-content-types (ASRPOOL_UPLOAD_CONTENT_TYPES)" in problem[1]
    assert (repr(content_type) if content_type else "no content type") in problem[1]


@pytest.mark.parametrize("content_type", [
    "audio/wav", "audio/ogg; codecs=opus", "Audio/MPEG", "application/ogg",
    "application/octet-stream"])
def test_audio_content_types_pass(content_type: str) -> None:
    assert limits.request_problem(_request("POST", **{"content-type": content_type}),
                                  _limits()) is None


def test_more_upload_types_can_be_allowed() -> None:
    given = _limits(upload_content_types="audio/*,video/webm")
    webm, mp4 = ({"content-type": f"video/{kind}"} for kind in ("webm", "mp4"))
    assert limits.request_problem(_request("POST", **webm), given) is None
    assert limits.request_problem(_request("POST", **mp4), given) is not None


def test_other_requests_are_not_checked() -> None:
    """A GET of a view from another page cannot read the answer (no CORS headers)."""
    request = h11.Request(method="GET", target="/api/modules_info",
                          headers=[("host", HOST), ("origin", "https://evil.example")])
    assert limits.request_problem(request, _limits()) is None
