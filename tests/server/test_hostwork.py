"""``asrpool bench hostwork`` measures this tree and an earlier commit side by side, each
in children of its own (here both are HEAD, so their code is the same)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from asrpool.bench import hostwork


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
    assert _worktrees() == before
