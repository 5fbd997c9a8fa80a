"""The router's live page in headless Chromium, its microphone fed from a WAV file: words
from the microphone, and a stream resumed when its connection is cut."""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

from asrpool.client.local import LocalPlatform
from asrpool.common.processes import free_port
from tests.support import chromium
from tests.support.cutting import CuttingProxy

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "hello.wav"


WORDS = "document.querySelectorAll('#words .word').length"


async def test_live_page_shows_words_from_the_microphone() -> None:
    async with _platform() as platform, _listening(platform.port) as page:
        status = await page.evaluate("document.getElementById('status').textContent")
        assert status == "listening"


async def test_live_page_resumes_its_stream_when_its_connection_is_cut() -> None:
    """Every connection through a proxy cut mid-stream: the page resumes the stream with
    the token the router told it in band, and words go on coming, on the same session."""
    async with _platform() as platform:
        proxy = CuttingProxy(platform.port)
        server = await proxy.serve()
        try:
            async with _listening(server.sockets[0].getsockname()[1]) as page:
                heard = await page.evaluate(WORDS)
                proxy.cut()
                await _until(page, f"{WORDS} > {heard + 3}", 90)
                status = await page.evaluate("document.getElementById('status').textContent")
                assert status == "listening"
        finally:
            server.close()
        assert _metric(platform.port, 'asrpool_router_admissions_total{kind="resume",'
                                      'pool="default"}') == 1
        assert _metric(platform.port, 'asrpool_router_admissions_total{kind="new",'
                                      'pool="default"}') == 1


@contextlib.asynccontextmanager
async def _platform() -> AsyncIterator[LocalPlatform]:
    platform = LocalPlatform(pods=1, slots_per_pod=2, model="tiny", port=free_port())
    await asyncio.to_thread(platform.start)
    try:
        yield platform
    finally:
        await asyncio.to_thread(platform.stop)


@contextlib.asynccontextmanager
async def _listening(port: int) -> AsyncIterator[chromium.Page]:
    """The live page at ``port``, started, once it has shown three words."""
    async with chromium.open_page(f"http://127.0.0.1:{port}/", SAMPLE) as page:
        await _until(page, "document.readyState === 'complete'")
        await _until(page, "document.querySelectorAll('#pools tbody tr').length === 1")
        await page.evaluate("document.getElementById('start').click()")
        await _until(page, f"{WORDS} >= 3", 90)
        yield page


def _metric(port: int, sample: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(sample + " "):
                return float(line.split()[1])
    return None


async def _until(page: chromium.Page, condition: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await page.evaluate(f"Boolean({condition})"):
            return
        await asyncio.sleep(0.2)
    state = await page.evaluate("document.getElementById('status')?.textContent")
    raise AssertionError(f"page never reached {condition!r} (status: {state!r})")
