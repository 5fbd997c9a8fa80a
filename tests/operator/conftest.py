"""Fixtures for the operator: the kmock emulator, a real Redis, the real kopf operator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import kmock
import kopf
import pytest
from kmock._internal import parsing
from kopf.testing import KopfRunner

from asrpool.operator import handlers, settings
from tests.operator import emulator, schemas
from tests.support import redis_servers


@pytest.fixture
async def cluster(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[emulator.Cluster]:
    """An emulated Kubernetes API over real HTTP that admits pools by the CRD's schema."""
    monkeypatch.setattr(parsing, "parse_path", emulator._parse_path)
    schema = schemas.strict(schemas.openapi(schemas.load_crd()))
    handler = emulator.Emulator(pool_schema=schema)
    async with handler, kmock.Server(handler):
        emulator.declare_resources(handler)
        emulator.add_namespace(handler, emulator.NAMESPACE)
        yield emulator.Cluster(handler)


@pytest.fixture
def operator_settings(
    cluster: emulator.Cluster, redis_server: redis_servers.RedisServer,
    request: pytest.FixtureRequest,
) -> settings.OperatorSettings:
    """The operator's settings; a test adds its own with ``indirect`` parametrization."""
    return settings.OperatorSettings(
        namespaces=[emulator.NAMESPACE], redis_url=redis_server.url, kube_api_url=cluster.url,
        resync_seconds=1.0, **getattr(request, "param", {}))


@pytest.fixture
async def operator(operator_settings: settings.OperatorSettings) -> AsyncIterator[KopfRunner]:
    """The real operator (kopf's CLI in a thread), entered and left off the event loop so
    the emulator keeps serving it."""
    runner = KopfRunner(
        ["run", "--standalone", "--verbose", "--namespace", emulator.NAMESPACE],
        registry=handlers.build_registry(operator_settings),
        settings=kopf.OperatorSettings(),
        timeout=60,
    )
    await asyncio.to_thread(runner.__enter__)
    try:
        yield runner
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)
