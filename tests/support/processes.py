"""Process trees from /proc: what a command left running."""

from __future__ import annotations

from pathlib import Path

from asrpool.common.processes import descendants

__all__ = ["alive", "descendants", "running_with"]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


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
