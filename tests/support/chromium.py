"""Headless Chromium (Debian's package) driven over the DevTools protocol.

A fake microphone plays a WAV file (`--use-file-for-fake-audio-capture`), so a page's
getUserMedia records that file.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
import tempfile
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from asrpool.common import processes
from asrpool.common.processes import free_port

FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
         "--autoplay-policy=no-user-gesture-required"]


def executable() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.ids = itertools.count(1)

    async def evaluate(self, expression: str) -> Any:
        message_id = next(self.ids)
        await self.socket.send(json.dumps({"id": message_id, "method": "Runtime.evaluate",
                                           "params": {"expression": expression,
                                                      "returnByValue": True,
                                                      "awaitPromise": True}}))
        while True:
            reply = json.loads(await self.socket.recv())
            if reply.get("id") == message_id:
                return reply["result"]["result"].get("value")


@contextlib.asynccontextmanager
async def open_page(url: str, microphone_wav: Path) -> AsyncIterator[Page]:
    binary = executable()
    assert binary is not None, "chromium is not installed (Debian package 'chromium')"
    port = free_port()
    # Chromium's helpers (renderer, crashpad) outlive its main process for a moment and
    # keep writing the profile: the whole group is stopped before the profile goes, and
    # a file one of them still adds meanwhile does not fail the test.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as folder:
        profile = Path(folder) / "profile"
        browser = processes.spawn(
            "chromium",
            [binary, *FLAGS, f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
             f"--use-file-for-fake-audio-capture={microphone_wav}", url],
            Path(folder) / "chromium.log")
        try:
            debugger = await asyncio.to_thread(_page_debugger_url, browser, port, url)
            async with connect(debugger, max_size=None) as socket:
                yield Page(socket)
        finally:
            await asyncio.to_thread(browser.stop, 10.0)


def _page_debugger_url(browser: processes.Child, port: int, url: str,
                       timeout: float = 30.0) -> str:
    found: list[str] = []

    def opened() -> bool:
        with (contextlib.suppress(ValueError),
              urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as response):
            found.extend(str(target["webSocketDebuggerUrl"]) for target in json.load(response)
                         if target.get("type") == "page"
                         and target.get("url", "").startswith(url))
        return bool(found)

    try:
        processes.wait_until(opened, timeout, "chromium's page", [browser])
    except processes.StartError as exc:
        raise RuntimeError(f"chromium did not open the page in time: {exc}") from None
    return found[0]
