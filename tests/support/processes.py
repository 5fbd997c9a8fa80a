"""Process trees from /proc: what a command left running; lines a started child printed."""

from __future__ import annotations

import re
from pathlib import Path

from asrpool.common import processes
from asrpool.common.processes import alive, descendants

__all__ = ["alive", "descendants", "printed", "running_with", "wait_printed"]


def printed(child: processes.Child, pattern: str) -> re.Match[str] | None:
    """The first line of ``child``'s log that ``pattern`` matches whole, or None (yet)."""
    try:
        text = child.log.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        found = re.fullmatch(pattern, line.strip())
        if found:
            return found
    return None


def wait_printed(child: processes.Child, pattern: str, timeout: float) -> re.Match[str]:
    """The first line of ``child``'s log that ``pattern`` matches whole, once it printed
    one (``tools/cluster/up`` prints ``ready``); :class:`processes.StartError` if it
    exits first or prints none within ``timeout`` seconds."""
    found: list[re.Match[str]] = []

    def seen() -> bool:
        line = printed(child, pattern)
        found.extend([line] if line else [])
        return bool(found)

    processes.wait_until(seen, timeout, f"{child.name} (a line {pattern!r})", [child])
    return found[0]


def running_with(text: str) -> list[str]:
    """Command lines of live processes that mention ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline and alive(int(entry.name)):
                found.append(cmdline)
    return found
