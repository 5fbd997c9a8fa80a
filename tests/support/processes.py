"""Process trees from /proc: what a command left running."""

from __future__ import annotations

import queue
import subprocess
import threading
from pathlib import Path

from asrpool.common.processes import alive, descendants

__all__ = ["alive", "descendants", "first_line", "running_with"]
NO_ANSWER = "(no answer)"


def first_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The first line ``process`` prints (``tools/cluster/up`` prints ``ready``), or
    :data:`NO_ANSWER` when none came within ``timeout`` seconds; its later output is read
    and dropped, so it never blocks on a full pipe."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.strip())
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return NO_ANSWER


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
