"""`asrpool demo`: stream a file through the local router and show what came back."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich.console import Console

from asrpool.client import streaming, tables
from asrpool.client.local import LocalPlatform
from asrpool.common import audio, registry

DEMO_RTF = 2.0
SNAPSHOT_AFTER_SECONDS = 1.5  # a heartbeat or two after the stream was admitted


def run(platform: LocalPlatform, path: Path) -> int:
    console = Console()
    try:
        pcm = audio.load_audio(path)
        console.print(f"streaming {path.name} through the router at {platform.router_url}")
        result, beats = asyncio.run(_stream_and_watch(platform, pcm))
    except (audio.AudioFileError, streaming.StreamError) as exc:
        print(f"asrpool demo: {exc}", file=sys.stderr)
        return 1
    if beats is not None:
        console.print(tables.pool_table(beats))
    console.print("transcript (the tiny model is random: its words mean nothing):")
    print(" ".join(m["text"] for m in result.words if m["type"] == "Word"), flush=True)
    return 0 if result.marker_seen else 1


async def _stream_and_watch(
    platform: LocalPlatform, pcm: NDArray[np.float32]
) -> tuple[streaming.StreamResult, list[registry.PodHeartbeat] | None]:
    """Stream the file and, while it is open, take one snapshot of the pool's slots."""
    watcher: list[asyncio.Task[list[registry.PodHeartbeat]]] = []

    def on_message(message: dict[str, Any]) -> None:
        if message.get("type") == "Ready" and not watcher:
            watcher.append(asyncio.get_running_loop().create_task(_later(platform)))

    result = await streaming.stream_messages(platform.router_url, audio.kyutai_file_messages(pcm),
                                             rtf=DEMO_RTF, on_message=on_message)
    return result, (await watcher[0]) if watcher else None


async def _later(platform: LocalPlatform) -> list[registry.PodHeartbeat]:
    await asyncio.sleep(SNAPSHOT_AFTER_SECONDS)
    return await platform.snapshot()
