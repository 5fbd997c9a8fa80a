"""A router of several workers keeps their metrics in a folder under ``TMPDIR``
(router.sharedmetrics); a killed router's folder is removed by the next one to start,
never a live router's."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from asrpool.common import processes
from asrpool.router import sharedmetrics
from tests.router import support
from tests.support.redis_servers import RedisServer


def folders(tmp: Path) -> set[Path]:
    return set(tmp.glob(sharedmetrics.PREFIX + "*"))


def router(redis: RedisServer, tmp_path: Path, tmp: Path) -> support.RouterProcess:
    proc = support.RouterProcess(redis.url, tmp_path, "--workers", "2",
                                 env={"TMPDIR": str(tmp)})
    proc.start()
    return proc


def kill_outright(proc: support.RouterProcess) -> None:
    """As the kernel kills a container: every process at once, no cleanup."""
    assert proc.proc is not None
    for pid in [*processes.descendants(proc.proc.pid), proc.proc.pid]:
        os.kill(pid, signal.SIGKILL)
    proc.proc.wait()


def test_a_killed_routers_metrics_are_removed_by_the_next_and_a_live_ones_kept(
        module_redis: RedisServer, tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    unlocked = tmp / (sharedmetrics.PREFIX + "making")  # no lock file yet: left alone
    unlocked.mkdir()
    first = router(module_redis, tmp_path, tmp)
    (killed,) = folders(tmp) - {unlocked}
    kill_outright(first)
    assert killed.is_dir()

    second = router(module_redis, tmp_path, tmp)
    try:
        (live,) = folders(tmp) - {unlocked}
        assert live != killed
        third = router(module_redis, tmp_path, tmp)
        try:
            assert len(folders(tmp) - {unlocked}) == 2 and live.is_dir()
        finally:
            assert third.terminate() == 0
        assert folders(tmp) == {live, unlocked}
    finally:
        assert second.terminate() == 0
    assert folders(tmp) == {unlocked}
