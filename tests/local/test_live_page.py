"""The router's live page in headless Chromium, its microphone fed from a WAV file."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from asrpool.client.local import LocalPlatform
from asrpool.common.processes import free_port
from tests.support import chromium

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "hello.wav"


async def test_live_page_shows_words_from_the_microphone() -> None:
    platform = LocalPlatform(pods=1, slots_per_pod=2, model="tiny", port=free_port())
    await asyncio.to_thread(platform.start)
    try:
        url = f"http://127.0.0.1:{platform.port}/"
        async with chromium.open_page(url, SAMPLE) as page:
            await _until(page, "document.readyState === 'complete'")
            await _until(page, "document.querySelectorAll('#pools tbody tr').length === 1")
            await page.evaluate("document.getElementById('start').click()")
            await _until(page, "document.querySelectorAll('#words .word').length >= 3", 90)
            status = await page.evaluate("document.getElementById('status').textContent")
            assert status == "listening"
    finally:
        await asyncio.to_thread(platform.stop)


async def _until(page: chromium.Page, condition: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await page.evaluate(f"Boolean({condition})"):
            return
        await asyncio.sleep(0.2)
    state = await page.evaluate("document.getElementById('status')?.textContent")
    raise AssertionError(f"page never reached {condition!r} (status: {state!r})")
