"""``asrpool bench hostwork`` measures this tree and an earlier commit side by side, each
in children of its own (here both are HEAD, so their code is the same)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

from asrpool.common import processes
from asrpool_harness.bench import hostwork


def _worktrees() -> set[str]:
    listed = subprocess.run(["git", "-C", str(hostwork.REPO), "worktree", "list", "--porcelain"],
                            check=True, capture_output=True, text=True).stdout
    return {line for line in listed.splitlines() if line.startswith("worktree ")}


def test_bench_hostwork_compares_two_trees_and_leaves_no_worktree(tmp_path: Path) -> None:
    before = _worktrees()
    assert hostwork.main(["--before", "HEAD", "--models", "tiny", "--inputs", "pcm-80ms,opus",
                          "--batch", "4", "--steps", "3", "--rounds", "1",
                          "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "hostwork.json").read_text())
    assert [(row["model"], row["input"]) for row in result["rows"]] == [
        ("tiny", "pcm-80ms"), ("tiny", "opus")]
    for row in result["rows"]:
        for figure in ("wall_us", "cpu_us"):
            assert row[figure]["before"] > 0 and row[figure]["after"] > 0
            assert row[figure]["after_over_before"] is not None
        assert row["helpers_cpu_us"]["after"] == 0  # no lanes: no children at work
    assert _worktrees() == before


def test_children_cpu_counts_a_busy_child_and_not_an_idle_one(tmp_path: Path) -> None:
    """A child that spins for 0.3 s of CPU shows it; one that sleeps shows none."""
    busy = processes.spawn(
        "a busy child",
        [sys.executable, "-c", "import time\nend = time.process_time() + 0.3"
         "\nwhile time.process_time() < end: pass\ntime.sleep(30)"], tmp_path / "busy.log")
    idle = processes.spawn("an idle child", [sys.executable, "-c", "import time; time.sleep(30)"],
                           tmp_path / "idle.log")
    try:
        with contextlib.suppress(processes.StartError):
            processes.wait_until(lambda: processes.cpu_seconds(busy.process.pid) >= 0.3, 20,
                                 "the busy child's spin", [busy, idle], period=0.05)
        assert processes.cpu_seconds(busy.process.pid) >= 0.3
        assert processes.cpu_seconds(idle.process.pid) < 0.2  # its interpreter's start alone
        assert hostwork.children_cpu_s() >= 0.3
    finally:
        for child in (busy, idle):
            child.stop(10)
