"""The live table of `asrpool up`: pods, slots and free slots, read from Redis."""

from __future__ import annotations

import asyncio
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from asrpool.client.local import LocalPlatform
from asrpool.common import registry


def pool_table(beats: list[registry.PodHeartbeat]) -> Table:
    table = Table(title="pool default")
    for column in ("pod", "address", "slots", "used", "free", "state"):
        table.add_column(column, justify="right" if column in ("slots", "used", "free") else "left")
    for beat in beats:
        table.add_row(beat.pod_id, beat.address, str(beat.total_slots), str(beat.used_slots),
                      str(beat.free_slots), "draining" if beat.draining else "serving")
    total = sum(b.total_slots for b in beats)
    free = sum(b.free_slots for b in beats)
    table.caption = f"{len(beats)} pods, {total} slots, {free} free"
    return table


def show_live(platform: LocalPlatform, refresh_seconds: float = 0.5) -> None:
    """Refresh the table until interrupted (Ctrl-C or SIGTERM)."""
    hint = Text(f"router: {platform.router_url}/api/asr-streaming   "
                f"try: asrpool stream {platform.router_url} FILE   (Ctrl-C stops everything)")
    with Live(console=Console(), auto_refresh=False) as live:
        while True:
            beats = asyncio.run(platform.snapshot())
            live.update(Group(hint, pool_table(beats)), refresh=True)
            time.sleep(refresh_seconds)
