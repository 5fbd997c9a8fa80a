"""The connection-limit settings are one mixin (asrpool.common.limits.LimitSettings):
pod and router share each field, its bounds and its help; only max_connections'
default differs."""

from __future__ import annotations

import dataclasses

import pydantic
import pytest

from asrpool.common import limits
from asrpool.router import settings as router_settings
from asrpool.server import settings as server_settings

CLASSES = (server_settings.ServerSettings, router_settings.RouterSettings)


# Limits that are no setting of their own: whether the server asks a key follows from
# each class's key settings (LimitSettings.asks_no_key).
DERIVED = {"keyless"}


def test_both_settings_classes_take_every_limit_from_the_mixin() -> None:
    names = {field.name for field in dataclasses.fields(limits.Limits)} - DERIVED
    assert names == set(limits.LimitSettings.model_fields)
    for settings_class in CLASSES:
        assert issubclass(settings_class, limits.LimitSettings)
        for name in names:
            ours, shared = (settings_class.model_fields[name],
                            limits.LimitSettings.model_fields[name])
            assert (ours.description, ours.metadata) == (shared.description, shared.metadata)


def test_only_the_connection_cap_default_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in limits.LimitSettings.model_fields:
        monkeypatch.delenv(f"ASRPOOL_{name.upper()}", raising=False)
    pod = server_settings.ServerSettings().connection_limits
    router = router_settings.RouterSettings().connection_limits
    assert (pod.max_connections, router.max_connections) == (2048, 16384)
    assert dataclasses.replace(router, max_connections=2048) == pod


def test_a_server_asks_no_key_only_without_keys_and_without_a_pod_token() -> None:
    assert server_settings.ServerSettings().connection_limits.keyless
    assert router_settings.RouterSettings().connection_limits.keyless
    for keyed in (server_settings.ServerSettings(api_keys_file="keys.json"),
                  server_settings.ServerSettings(pod_token="secret"),
                  router_settings.RouterSettings(api_keys_file="keys.json")):
        assert not keyed.connection_limits.keyless


def test_the_limits_come_from_the_settings_and_keep_their_bounds() -> None:
    config = router_settings.RouterSettings(max_headers=20, handshake_timeout_seconds=3)
    assert (config.connection_limits.max_headers,
            config.connection_limits.handshake_timeout_seconds) == (20, 3.0)
    for settings_class in CLASSES:
        with pytest.raises(pydantic.ValidationError, match="max_connections"):
            settings_class(max_connections=1)
