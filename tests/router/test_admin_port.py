"""A router with an admin port (``route --admin-port``): the public port serves what
clients use (streams, uploads, the live page, /api/pools) and the probes; the admin
port serves the metrics and the router's internals and the probes; each refuses the
other's with 404, with one worker or several."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets

from asrpool.common import processes, protocol
from tests.router import support
from tests.support.redis_servers import RedisServer

PUBLIC_ONLY = ["/", "/static/live.js", "/api/pools"]
ADMIN_ONLY = ["/metrics", "/api/build_info", "/api/modules_info"]
BOTH = ["/healthz", "/readyz"]


@pytest.fixture(scope="module", params=[1, 2], ids=["one-worker", "two-workers"])
def router(request: pytest.FixtureRequest, module_redis: RedisServer,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[support.RouterProcess,
                                                                      int]]:
    admin = processes.free_port()
    proc = support.RouterProcess(module_redis.url, tmp_path_factory.mktemp("admin"),
                                 "--admin-port", str(admin), "--workers", str(request.param))
    proc.start()
    try:
        yield proc, admin
    finally:
        proc.kill()


def status(url: str) -> int:
    return support.http_get(url)[0]


def test_each_port_serves_its_own_paths_and_the_probes(
        router: tuple[support.RouterProcess, int]) -> None:
    proc, admin = router
    admin_url = f"http://127.0.0.1:{admin}"
    for path in PUBLIC_ONLY:
        assert (status(proc.url + path), status(admin_url + path)) == (200, 404), path
    for path in ADMIN_ONLY:
        assert (status(proc.url + path), status(admin_url + path)) == (404, 200), path
    for path in BOTH:
        assert (status(proc.url + path), status(admin_url + path)) == (200, 200), path


async def test_streams_are_refused_on_the_admin_port(
        router: tuple[support.RouterProcess, int]) -> None:
    _, admin = router
    url = f"ws://127.0.0.1:{admin}{protocol.STREAMING_PATH}"
    with pytest.raises(websockets.InvalidStatus, match="404"):
        async with websockets.connect(url, proxy=None):
            pass


def test_the_admin_port_may_not_be_the_public_one(tmp_path: Path) -> None:
    from asrpool import cli

    assert cli.main(["route", "--port", "9000", "--admin-port", "9000"]) == 2
